"""The package's version, read once from its installed metadata: the one source for serverInfo, /metadata and logs."""

from __future__ import annotations

from importlib import metadata

try:
    VERSION = metadata.version("opencode-env")
except metadata.PackageNotFoundError:
    VERSION = "0+unknown"
