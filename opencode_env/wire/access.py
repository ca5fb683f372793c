"""What the server and the client both say about reaching a server: the access token's environment variable (the
server requires it, the client sends it), and the readiness route's words for a server still loading; a leaf
module, so the server never imports the client for them."""

from __future__ import annotations

TOKEN_VAR = "OPENCODE_ENV_TOKEN"
READY_PATH = "/ready"
STARTING = "the server is starting (loading its dependencies): retry in a few seconds"
"""/ready's 503 reason while the server loads; any other reason means it could not start."""
