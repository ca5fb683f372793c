"""The access token's environment variable, shared by the server (which requires it) and the client (which sends
it); a leaf module, so the server never imports the client for it."""

from __future__ import annotations

TOKEN_VAR = "OPENCODE_ENV_TOKEN"
