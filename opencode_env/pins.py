"""Pinned versions and flags shared by the pipeline, the backends, the E2B template and the image (a leaf module)."""

from __future__ import annotations

OPENCODE_VERSION = "1.18.33"
OPENCODE_PACKAGE = "opencode-ai"
PROXY_PYTHON_PACKAGES = ("fastapi", "uvicorn", "uvloop", "httptools")
AGENT_ENV = {
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
}
