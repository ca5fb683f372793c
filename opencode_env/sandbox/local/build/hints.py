"""What to do about a task image that cannot be built because its base is not here: images are never pulled (an
image build has no registry to reach; see image_build.py), so a `FROM` naming an image that is not in this
machine's container storage fails with podman's "image not known". The hint says the three ways out."""

from __future__ import annotations

import re

from opencode_env.sandbox.local.images import BASE_IMAGE

_NOT_KNOWN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._/:@-]*): image not known")


def missing_base_hint(message: str) -> str:
    """`message` with what to do when it says an image is not in local storage; unchanged otherwise."""
    found = _NOT_KNOWN.search(message)
    if found is None:
        return message
    image = found.group(1)
    return (
        f"{message}\n  {image} is not in this machine's container storage, and task images are never pulled. "
        f"Build it (`podman build -t {image} DIR`; for {BASE_IMAGE}: `opencode-env image build-base`), "
        f"load it (`podman load -i IMAGE.tar`), or, on a machine that reaches a registry, pull it yourself "
        f"(`podman pull {image}`) before the task runs."
    )
