"""Pinned versions and flags shared by the pipeline, the backends, the E2B template and the image (a leaf module)."""

from __future__ import annotations

OPENCODE_VERSION = "1.18.33"
OPENCODE_PACKAGE = "opencode-ai"
PLUGIN_PACKAGE = "@opencode-ai/plugin"
"""OpenCode npm-installs this into each config directory at start unless it is already there (same version)."""
PROXY_PYTHON_PACKAGES = ("uvicorn", "uvloop", "httptools", "orjson")
TEMPLATE_FORMAT = "2"
"""What a cloud template or image must provide; bumped when that changes (2: the proxy runs as root, `user` has no
sudo). A template that says otherwise is refused with "rebuild the template"."""
TEMPLATE_FORMAT_VAR = "OPENCODE_ENV_TEMPLATE_FORMAT"
AGENT_ENV = {
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    # OpenCode reads only the configuration we give it: no opencode.json / .opencode found up from the work dir, no
    # Claude Code files or skills from the home or the project (the task's files and setup can write all of these).
    "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
}
