"""The commands the Hugging Face backend sends, as pure text: HF's sandbox server runs every command as root, so
task commands drop to `user` here, the image is prepared once, and files move through commands run as `user`.

Running file operations as `user` (rather than through the SDK's file API, which acts as root) keeps ownership
right (the agent can edit what the pipeline wrote) and means a hard link or a path the task planted can never make
root read or write a file for it.
"""

from __future__ import annotations

import shlex

from opencode_env.sandbox.base import AGENT_LOG_DIR, HOME, VERIFIER_DIR, WORKDIR, FileEntry, Identity
from opencode_env.sandbox.cloud.grader import GRADER_ENV, GRADER_USER
from opencode_env.sandbox.cloud.lifecycle import OPENCODE_VERSION_PROBE
from opencode_env.wire import OPENCODE_VERSION, PROXY_PYTHON_PACKAGES

USER = "user"
USER_NPM_PREFIX = f"{HOME}/.npm-global"
DEFAULT_TOOLS_DIR = "/opt/opencode-env"
MISSING_EXIT = 3
TOO_BIG_EXIT = 4
MAX_READ_BYTES = 256 * 1024 * 1024

# The sandbox server hands its own variables (SBX_*, its token among them) to the commands it starts; they are
# removed before anything runs, and `user` gets no capability, no new privileges (setuid) and a fixed HOME.
_DROP_SERVER_VARS = "for name in $(env | sed -n 's/^\\(SBX_[A-Za-z0-9_]*\\)=.*/\\1/p'); do unset \"$name\"; done"
_AS_USER = f"""{_DROP_SERVER_VARS}
export HOME={HOME} USER={USER} LOGNAME={USER} NPM_CONFIG_PREFIX={USER_NPM_PREFIX}
export PATH="$OPENCODE_ENV_TOOLS_BIN:{USER_NPM_PREFIX}/bin:{HOME}/.local/bin:$PATH"
unset OPENCODE_ENV_TOOLS_BIN
exec setpriv --reuid={USER} --regid={USER} --init-groups --no-new-privs --inh-caps=-all -- /bin/bash -c "$1"
"""
_AS_ROOT = f"""{_DROP_SERVER_VARS}
export HOME=/root PATH="$OPENCODE_ENV_TOOLS_BIN:$PATH"
unset OPENCODE_ENV_TOOLS_BIN
exec /bin/bash -c "$1"
"""


_AS_GRADER = f"""{_DROP_SERVER_VARS}
export {" ".join(f"{name}={value}" for name, value in GRADER_ENV.items())}
export PATH="$OPENCODE_ENV_TOOLS_BIN:$PATH"
unset OPENCODE_ENV_TOOLS_BIN
exec setpriv --reuid={GRADER_USER} --regid={GRADER_USER} --clear-groups --no-new-privs --inh-caps=-all \
  -- /bin/bash -c "$1"
"""


def as_user(cmd: str) -> list[str]:
    return ["/bin/sh", "-c", _AS_USER, "opencode-env", cmd]


def as_root(cmd: str) -> list[str]:
    return ["/bin/sh", "-c", _AS_ROOT, "opencode-env", cmd]


_AS_ROOT_GRADER = f"""{_DROP_SERVER_VARS}
export {" ".join(f"{name}={value}" for name, value in GRADER_ENV.items() if name not in ("USER", "LOGNAME"))}
export PATH="$OPENCODE_ENV_TOOLS_BIN:$PATH"
unset OPENCODE_ENV_TOOLS_BIN
exec /bin/bash -c "$1"
"""


def as_identity(identity: Identity, cmd: str, *, grader_is_root: bool = False) -> list[str]:
    """OpenCode's command comes as root's, which drops to OpenCode's own uid (CloudSandbox.run). A grader that is
    root (verify_as='root') keeps the grader's fresh HOME and TMPDIR."""
    grader = _AS_ROOT_GRADER if grader_is_root else _AS_GRADER
    shell = {"root": _AS_ROOT, "grader": grader}.get(identity, _AS_USER)
    return ["/bin/sh", "-c", shell, "opencode-env", cmd]


def prepare_image() -> str:
    """Run once as root at creation: `user` exists (created when the image lacks it) and owns /home/user."""
    return f"""set -e
if [ "$(id -u)" != 0 ]; then
  echo "the sandbox server runs as uid $(id -u), not root: use an image without USER (opencode-env drops to {USER})" >&2
  exit {MISSING_EXIT}
fi
if ! command -v setpriv >/dev/null; then
  echo "the image has no setpriv (util-linux), which runs task commands as {USER}" >&2
  exit {MISSING_EXIT}
fi
if ! id -u {USER} >/dev/null 2>&1; then
  useradd --create-home --uid 1000 --shell /bin/bash {USER} 2>/dev/null \
    || useradd --create-home --shell /bin/bash {USER}
fi
mkdir -p {WORKDIR} {VERIFIER_DIR} {AGENT_LOG_DIR}
chown -R {USER}:{USER} {HOME}
"""


# OpenCode as `user` runs it (it writes under its HOME); the proxy's packages as root imports them (-E -s).
OPENCODE_PROBE = f"{OPENCODE_VERSION_PROBE}; true"
PROXY_PROBE = "python3 -E -s -c 'import uvicorn' 2>/dev/null && echo proxy-deps-ok; true"


def install_proxy_packages() -> str:
    """Run as root when the image lacks them: the proxy's packages where root's `python3 -E -s` finds them."""
    packages = " ".join(PROXY_PYTHON_PACKAGES)
    return (
        f"python3 -m pip install --quiet --no-cache-dir {packages} 2>/dev/null "
        f"|| python3 -m pip install --quiet --no-cache-dir --break-system-packages {packages}"
    )


_FETCH = (
    "import shutil, sys, urllib.request; "
    'shutil.copyfileobj(urllib.request.urlopen(sys.argv[1]), open(sys.argv[2], "wb"))'
)


def install_opencode(tools_dir: str, version: str = OPENCODE_VERSION, *, portable: bool = False) -> str:
    """Run as root when the image lacks OpenCode: its single binary for this CPU, straight from the npm registry
    (no node or npm needed), into a root-owned directory. `portable` takes the x86-64 build that needs no AVX2
    (for an image, which does not know the CPU it will run on)."""
    target = f"{tools_dir}/opencode-{version}"
    avx2 = "false" if portable else "grep -qw avx2 /proc/cpuinfo"
    return f"""set -e
FETCH='{_FETCH}'
case "$(uname -m)" in
  x86_64) pkg=opencode-linux-x64; {avx2} || pkg=opencode-linux-x64-baseline ;;
  aarch64|arm64) pkg=opencode-linux-arm64 ;;
  *) echo "OpenCode has no Linux build for $(uname -m)" >&2; exit {MISSING_EXIT} ;;
esac
url="https://registry.npmjs.org/$pkg/-/$pkg-{version}.tgz"
mkdir -p {target} {tools_dir}/bin
if command -v curl >/dev/null; then curl -fsSL "$url" -o {target}/pkg.tgz
elif command -v wget >/dev/null; then wget -q "$url" -O {target}/pkg.tgz
else python3 -c "$FETCH" "$url" {target}/pkg.tgz
fi
tar -xzf {target}/pkg.tgz -C {target} && rm {target}/pkg.tgz
ln -sf {target}/package/bin/opencode {tools_dir}/bin/opencode
test -x {tools_dir}/bin/opencode
"""


def main() -> None:
    """`python -m opencode_env.sandbox.cloud.hf_shell install-opencode DIR`: the install script, for the image build."""
    import sys

    if sys.argv[1:2] != ["install-opencode"] or len(sys.argv) != 3:
        raise SystemExit("usage: python -m opencode_env.sandbox.cloud.hf_shell install-opencode DIR")
    print(install_opencode(sys.argv[2], portable=True))


if __name__ == "__main__":
    main()


def watchdog(lifetime_s: float) -> str:
    """Run as root in the background: past its lifetime every process is killed, so an abandoned sandbox goes
    idle and the SDK's idle timeout ends its Job (a running process would otherwise keep it alive for 24 h)."""
    return f"sleep {int(lifetime_s)}; kill -KILL -1"


def write_file(path: str, *, mkdir: bool = True) -> str:
    """Base64 on stdin (the SDK's stdin is text) becomes the file's bytes."""
    quoted = shlex.quote(path)
    prefix = f'mkdir -p -- "$(dirname -- {quoted})" && ' if mkdir else ""
    return f"{prefix}base64 -d > {quoted}"


def read_file(path: str) -> str:
    """A regular file (not a symlink) as one base64 line; exit codes say missing or too big."""
    quoted = shlex.quote(path)
    return (
        f"if [ -L {quoted} ] || [ ! -f {quoted} ]; then exit {MISSING_EXIT}; fi; "
        f'[ "$(stat -c %s -- {quoted})" -le {MAX_READ_BYTES} ] || exit {TOO_BIG_EXIT}; '
        f"base64 -w0 -- {quoted}"
    )


def read_tail(path: str, limit: int) -> str:
    """The last `limit` bytes of a regular file (not a symlink) as one base64 line."""
    quoted = shlex.quote(path)
    return (
        f"if [ -L {quoted} ] || [ ! -f {quoted} ]; then exit {MISSING_EXIT}; fi; "
        f"tail -c {int(limit)} -- {quoted} | base64 -w0"
    )


def write_control_file(path: str) -> str:
    """As root: a file `user` can read but not change, in a root-owned directory."""
    quoted = shlex.quote(path)
    directory = shlex.quote(path.rsplit("/", 1)[0])
    return f"mkdir -p -m 755 {directory} && base64 -d > {quoted} && chmod 644 {quoted}"


def list_files(root: str, limit: int) -> str:
    """Regular files under root (symlinks are not followed), NUL-separated `path TAB size`, sorted, at most limit."""
    quoted = shlex.quote(root)
    return f"[ -d {quoted} ] || exit 0; find {quoted} -type f -printf '%P\\t%s\\0' | sort -z | head -z -n {int(limit)}"


def parse_listing(text: str) -> list[FileEntry]:
    entries = []
    for record in text.split("\0"):
        path, tab, size = record.rpartition("\t")
        if tab and path and size.isdigit():
            entries.append(FileEntry(path, int(size)))
    return entries


def parse_probe(stdout: str) -> tuple[str | None, bool]:
    """(OpenCode's version or None, whether the proxy's Python packages import)."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    version = next((line for line in lines if line[:1].isdigit()), None)
    return version, "proxy-deps-ok" in lines
