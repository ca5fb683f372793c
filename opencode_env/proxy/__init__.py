"""The capture proxy. It imports nothing from the rest of opencode_env, so its files can be uploaded as they are."""
