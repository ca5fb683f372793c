"""The one rollout pipeline and what it drives: OpenCode, the capture proxy's host side, the reward, the
collection of files, limits and endpoints; it knows no transport."""
