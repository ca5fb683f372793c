"""The cloud backends (E2B, Hugging Face Sandboxes) and what they share: admission, the root-run proxy, the
grader hand-over, the E2B template."""
