"""The local backend's public face: what the command line, the task format, evals, the cluster and the cloud fakes
use of it (the backend, its tools cache, image building and the image store, data-dir reads, its memory budget). A
contract lets nothing outside the backend import any other of its modules. Names load on first use, so a command
that needs one of them does not import the rest (the `X as X` imports are what mark a name re-exported)."""

# ruff: noqa: PLC0414

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opencode_env.sandbox.local.admission import (
        DEFAULT_OVERCOMMIT as DEFAULT_OVERCOMMIT,
    )
    from opencode_env.sandbox.local.admission import (
        memory_budget_mb as memory_budget_mb,
    )
    from opencode_env.sandbox.local.backend import LocalBackend as LocalBackend
    from opencode_env.sandbox.local.backend import LocalSandbox as LocalSandbox
    from opencode_env.sandbox.local.files.data_dir import (
        DataDir as DataDir,
    )
    from opencode_env.sandbox.local.files.data_dir import (
        DataError as DataError,
    )
    from opencode_env.sandbox.local.files.data_dir import (
        read_data_file as read_data_file,
    )
    from opencode_env.sandbox.local.images.base_image import (
        MIRROR as MIRROR,
    )
    from opencode_env.sandbox.local.images.base_image import (
        SUITE as SUITE,
    )
    from opencode_env.sandbox.local.images.base_image import (
        BaseImageError as BaseImageError,
    )
    from opencode_env.sandbox.local.images.base_image import (
        build_base_image as build_base_image,
    )
    from opencode_env.sandbox.local.images.budget import ImageBudget as ImageBudget
    from opencode_env.sandbox.local.images.build.box import MAX_BUILD_TIMEOUT_S as MAX_BUILD_TIMEOUT_S
    from opencode_env.sandbox.local.images.build.builder import (
        BuildProgress as BuildProgress,
    )
    from opencode_env.sandbox.local.images.build.builder import (
        ImageBuilder as ImageBuilder,
    )
    from opencode_env.sandbox.local.images.build.builder import (
        ImageBuildError as ImageBuildError,
    )
    from opencode_env.sandbox.local.images.build.builder import (
        is_image_reference as is_image_reference,
    )
    from opencode_env.sandbox.local.images.build.hints import (
        OFFLINE_HINT as OFFLINE_HINT,
    )
    from opencode_env.sandbox.local.images.build.hints import (
        missing_base_hint as missing_base_hint,
    )
    from opencode_env.sandbox.local.images.build.hints import (
        network_steps as network_steps,
    )
    from opencode_env.sandbox.local.images.build.hints import (
        only_local_urls as only_local_urls,
    )
    from opencode_env.sandbox.local.images.store import (
        ARCHIVE_PREFIXES as ARCHIVE_PREFIXES,
    )
    from opencode_env.sandbox.local.images.store import (
        BASE_IMAGE as BASE_IMAGE,
    )
    from opencode_env.sandbox.local.images.store import (
        HOST_IMAGE as HOST_IMAGE,
    )
    from opencode_env.sandbox.local.images.store import (
        ImageStore as ImageStore,
    )
    from opencode_env.sandbox.local.images.store import (
        archive_dir_of as archive_dir_of,
    )
    from opencode_env.sandbox.local.images.store import (
        default_image as default_image,
    )
    from opencode_env.sandbox.local.images.store import (
        image_exists as image_exists,
    )
    from opencode_env.sandbox.local.isolation.cgroup import PROXY_LIMITS as PROXY_LIMITS
    from opencode_env.sandbox.local.isolation.egress import parse_trusted_hosts as parse_trusted_hosts
    from opencode_env.sandbox.local.layout import reap_orphans as reap_orphans
    from opencode_env.sandbox.local.sandbox_processes import LocalProcess as LocalProcess
    from opencode_env.sandbox.local.tools import (
        cache_root as cache_root,
    )
    from opencode_env.sandbox.local.tools import (
        cached_tools as cached_tools,
    )
    from opencode_env.sandbox.local.tools import (
        install_cached as install_cached,
    )
    from opencode_env.sandbox.local.tools import (
        install_config_deps as install_config_deps,
    )
    from opencode_env.sandbox.local.tools import (
        npm_cache as npm_cache,
    )

WHERE = {
    "DEFAULT_OVERCOMMIT": "admission",
    "memory_budget_mb": "admission",
    "LocalBackend": "backend",
    "LocalSandbox": "backend",
    "BaseImageError": "images.base_image",
    "MIRROR": "images.base_image",
    "SUITE": "images.base_image",
    "build_base_image": "images.base_image",
    "MAX_BUILD_TIMEOUT_S": "images.build.box",
    "BuildProgress": "images.build.builder",
    "ImageBuildError": "images.build.builder",
    "ImageBuilder": "images.build.builder",
    "is_image_reference": "images.build.builder",
    "OFFLINE_HINT": "images.build.hints",
    "missing_base_hint": "images.build.hints",
    "network_steps": "images.build.hints",
    "only_local_urls": "images.build.hints",
    "PROXY_LIMITS": "isolation.cgroup",
    "DataDir": "files.data_dir",
    "DataError": "files.data_dir",
    "read_data_file": "files.data_dir",
    "parse_trusted_hosts": "isolation.egress",
    "ImageBudget": "images.budget",
    "ARCHIVE_PREFIXES": "images.store",
    "BASE_IMAGE": "images.store",
    "HOST_IMAGE": "images.store",
    "ImageStore": "images.store",
    "archive_dir_of": "images.store",
    "default_image": "images.store",
    "image_exists": "images.store",
    "reap_orphans": "layout",
    "LocalProcess": "sandbox_processes",
    "cache_root": "tools",
    "cached_tools": "tools",
    "install_cached": "tools",
    "install_config_deps": "tools",
    "npm_cache": "tools",
}
"""Each public name and the module of the backend that defines it."""


def __getattr__(name: str) -> object:
    if name not in WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"opencode_env.sandbox.local.{WHERE[name]}"), name)
