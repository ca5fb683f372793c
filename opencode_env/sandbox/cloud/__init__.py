"""The cloud backends (E2B, Hugging Face Sandboxes) and what they share: the lifecycle of a VM (lifecycle.py:
admission, stagger, kill-if-late, tags), the Sandbox contract on a VM (sandbox.py), admission limits, the root-run
proxy, the grader hand-over, the E2B template."""
