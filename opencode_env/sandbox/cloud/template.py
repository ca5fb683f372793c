"""The E2B template: OpenCode, its plugin and the proxy's packages baked in, so no rollout installs anything.

`opencode-env build-template --dry-run` prints the equivalent Dockerfile (offline); without it the template is
built on E2B (needs E2B_API_KEY). A rollout on a sandbox without this template installs OpenCode and the proxy's
packages itself, which an upstream project measured at ~2-3 minutes per rollout against ~20-30 s with a template.
"""

from __future__ import annotations

from typing import Any

from opencode_env.sandbox.base import AGENT_LOG_DIR, HOME, OPENCODE_CONFIG_DIR, VERIFIER_DIR, WORKDIR
from opencode_env.sandbox.cloud.e2b import DEFAULT_TEMPLATE
from opencode_env.wire import (
    AGENT_ENV,
    OPENCODE_PACKAGE,
    OPENCODE_VERSION,
    PLUGIN_PACKAGE,
    PROXY_PYTHON_PACKAGES,
    TEMPLATE_FORMAT,
    TEMPLATE_FORMAT_ENV_NAME,
)

NO_SUDO_FOR_USER = (
    "rm -f /etc/sudoers.d/user* && (deluser user sudo 2>/dev/null || true)"
    " && (gpasswd -d user wheel 2>/dev/null || true)"
)


def template_builder() -> Any:
    from e2b import Template

    return (
        Template()
        .from_python_image("3.11")
        .apt_install(["nodejs", "npm", "git", "ripgrep", "ca-certificates"], no_install_recommends=True)
        .npm_install([f"{OPENCODE_PACKAGE}@{OPENCODE_VERSION}"], g=True)
        .pip_install(list(PROXY_PYTHON_PACKAGES))
        .run_cmd("id -u user >/dev/null 2>&1 || useradd --create-home --uid 1000 user")
        .make_dir([WORKDIR, VERIFIER_DIR, AGENT_LOG_DIR, OPENCODE_CONFIG_DIR], user="user")
        .run_cmd(f"chown -R user:user {HOME}")
        # The proxy (and its key) runs as root: `user`, who runs every task command, must not become root.
        .run_cmd(NO_SUDO_FOR_USER)
        .run_cmd(
            f"cd {OPENCODE_CONFIG_DIR} && npm install --no-fund --no-audit {PLUGIN_PACKAGE}@{OPENCODE_VERSION}",
            user="user",
        )
        .set_envs({**AGENT_ENV, TEMPLATE_FORMAT_ENV_NAME: TEMPLATE_FORMAT})
        .set_user("user")
        .set_workdir(WORKDIR)
    )


def dockerfile() -> str:
    from e2b import Template

    text: str = Template.to_dockerfile(template_builder())
    return text


def build(name: str = DEFAULT_TEMPLATE, *, cpu_count: int = 2, memory_mb: int = 2048) -> Any:
    from e2b import Template

    return Template.build(
        template_builder(),
        name,
        cpu_count=cpu_count,
        memory_mb=memory_mb,
        on_build_logs=lambda entry: print(entry, flush=True),
    )
