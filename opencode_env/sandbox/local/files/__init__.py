"""Host-side file access that never trusts what it reads: link-proof walks and writes in a rollout's tree, task
directories read as data, and size-bounded file systems."""
