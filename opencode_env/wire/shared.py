"""What the request, the turn and the result share, and the package's fixed facts every layer may read (a leaf
module: it imports nothing of ours).

- The float type of the wire: NaN and the infinities travel as named strings, since JSON has no such numbers.
- Pinned versions and flags shared by the pipeline, the backends, the E2B template and the image.
- The package's version, read once from its installed metadata: the one source for serverInfo, /metadata and logs.
- What the server and the client both say about reaching a server: the access token's environment variable (the
  server requires it, the client sends it), and the readiness route's words for a server still loading, so the
  server never imports the client for them.
"""

from __future__ import annotations

import math
from importlib import metadata
from typing import Annotated, Literal

from pydantic import PlainSerializer

NonFiniteName = Literal["Infinity", "-Infinity", "NaN"]


def _float_for_json(value: float) -> float | NonFiniteName:
    """JSON has no NaN or infinities, and pydantic writes them as null, which does not parse back as a float."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


WireFloat = Annotated[float, PlainSerializer(_float_for_json, return_type=float | NonFiniteName, when_used="json")]
"""A float that every JSON form of a result carries: `model_dump_json` and `model_dump(mode="json")` write NaN,
Infinity and -Infinity as those strings (the serialization schema, which MCP clients check, allows them), and
validation reads the strings back as the floats. Standard JSON parsers accept it: JavaScript's JSON.parse gives the
string, and `Number(x)` the number."""


OPENCODE_VERSION = "1.18.33"
OPENCODE_PACKAGE = "opencode-ai"
PLUGIN_PACKAGE = "@opencode-ai/plugin"
"""OpenCode npm-installs this into each config directory at start unless it is already there (same version)."""
PROXY_PYTHON_PACKAGES = ("uvicorn", "uvloop", "httptools", "orjson")
TEMPLATE_FORMAT = "2"
"""What a cloud template or image must provide; bumped when that changes (2: the proxy runs as root, `user` has no
sudo). A template that says otherwise is refused with "rebuild the template"."""
TEMPLATE_FORMAT_ENV_NAME = "OPENCODE_ENV_TEMPLATE_FORMAT"
"""The variable our template images carry TEMPLATE_FORMAT in (set by us in the image, not an operator setting)."""
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


try:
    VERSION = metadata.version("opencode-env")
except metadata.PackageNotFoundError:
    VERSION = "0+unknown"


READY_PATH = "/ready"
STARTING = "the server is starting (loading its dependencies): retry in a few seconds"
"""/ready's 503 reason while the server loads; any other reason means it could not start."""
