"""The corpus's tasks carry test files of their own (run inside sandboxes by their test.sh), never by this pytest."""

collect_ignore_glob = ["*/tests/*"]
