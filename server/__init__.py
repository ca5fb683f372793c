"""The opencode-env server: OpenEnv's app plus a standard MCP endpoint, serving the `run_rollout` tool."""
