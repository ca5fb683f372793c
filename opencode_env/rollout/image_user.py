"""A Dockerfile USER as Docker applies it to a container's commands (pure: shell text run by the sandbox's root).

`name` or `uid` alone: that user, its primary group and supplementary groups from the image's /etc/passwd and
/etc/group (group 0 for a uid the image does not list); `user:group`: that group only. HOME is the user's home
from the image's passwd, else `/`. The drop is the image's own `setpriv` (util-linux), started by the sandbox's
root, which runs the task's code anyway: no trusted program of ours runs it.
"""

from __future__ import annotations

import shlex

NO_SETPRIV = 126


def _parts(user: str) -> tuple[str, str]:
    name, _, group = user.partition(":")
    return shlex.quote(name), shlex.quote(group) if group else ""


def owner(user: str) -> str:
    """`uid:gid` of the image's USER as a shell word (for chown)."""
    name, group = _parts(user)
    gid = group or f"$(id -g -- {name} 2>/dev/null || echo 0)"
    return f'"$(id -u -- {name} 2>/dev/null || echo {name})":"{gid}"'


def as_image_user(user: str, command: str) -> str:
    """`command` (shell text) run as the image's USER, from a shell of the sandbox's root."""
    name, group = _parts(user)
    groups = (
        "--clear-groups" if group else f"$(id -- {name} >/dev/null 2>&1 && echo --init-groups || echo --clear-groups)"
    )
    gid = group or f'"$(id -g -- {name} 2>/dev/null || echo 0)"'
    missing = f"the image's USER {user}: the image has no setpriv (util-linux) to run its commands as that user"
    return (
        f"command -v setpriv >/dev/null 2>&1 || {{ echo {shlex.quote(missing)} >&2; exit {NO_SETPRIV}; }}\n"
        f'HOME="$(getent passwd {name} | cut -d: -f6)"; export HOME="${{HOME:-/}}"\n'
        f"exec setpriv --reuid={name} --regid={gid} {groups} -- /bin/sh -c {shlex.quote(command)}\n"
    )
