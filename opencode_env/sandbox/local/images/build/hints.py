"""What to do about a task image that cannot be built because its base is not here: images are never pulled (an
image build has no registry to reach; see image_build.py), so a `FROM` naming an image that is not in this
machine's container storage fails with podman's "image not known". The hint says the three ways out."""

from __future__ import annotations

import re

from opencode_env.sandbox.local.images.store import BASE_IMAGE

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


_OFFLINE = re.compile(
    r"Temporary failure in name resolution|Temporary failure resolving|Could not resolve host|Name or service not "
    r"known|No address associated with hostname|Network is unreachable|Failed to establish a new connection|"
    r"EAI_AGAIN|getaddrinfo|\(from versions: none\)|Could not resolve",
)
OFFLINE_HINT = (
    "the build has no network (task images are built offline: no registry, no package index, no DNS): install "
    "what the task needs in the request's `setup` (it runs as the sandbox's root, with the network the request "
    "allows), or pre-build the image on a machine with network (`podman build -t IMAGE DIR`, or `podman load`) and "
    "name it in task.toml's [environment] docker_image"
)


def offline_hint(message: str) -> str:
    """`message` with what to do when a build step failed reaching the network; unchanged otherwise."""
    if _OFFLINE.search(message) is None:
        return message
    return f"{message}\n  {OFFLINE_HINT}"


_NETWORK_STEP = re.compile(
    r"^\s*ADD\s+(?:--\S+\s+)*https?://|^[^#]*\b(?:pip3?\s+install|pip\s+download|uv\s+(?:pip\s+install|sync|add|tool\s+install)|uvx|poetry\s+install|"
    r"npm\s+(?:install|ci)|yarn\s+(?:install|add)|pnpm\s+(?:install|add)|gem\s+install|cargo\s+(?:install|fetch)|"
    r"go\s+(?:get|mod\s+download)|apt(?:-get)?\s+(?:update|install)|apk\s+add|(?:yum|dnf)\s+install|curl|wget|"
    r"git\s+clone)\b",
    re.IGNORECASE,
)


_URL_HOST = re.compile(r"\bhttps?://([^/:\s\"'@]+)", re.IGNORECASE)
_DOWNLOADERS = re.compile(r"\b(?:curl|wget)\b", re.IGNORECASE)


def only_local_urls(line: str, local: frozenset[str]) -> bool:
    """A curl or wget of addresses on the sandbox's own loopback only (`local`: its names, a compose task's
    services among them), with no other network step on the line: no network needed."""
    hosts = [host.lower() for host in _URL_HOST.findall(line)]
    others = _NETWORK_STEP.search(_DOWNLOADERS.sub("", line))
    return bool(hosts) and others is None and all(host in local for host in hosts)


def network_steps(dockerfile: str) -> list[tuple[int, str]]:
    """(line number, line) of each Dockerfile step that looks like it reaches the network (a package install, a
    download, a clone): such a step fails in the offline build."""
    return [
        (number, line.strip()[:160])
        for number, line in enumerate(dockerfile.splitlines(), start=1)
        if _NETWORK_STEP.search(line)
    ]
