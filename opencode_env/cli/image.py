"""`opencode-env image`: build the local backend's base image, or unpack an image into the cache ahead of use.

The cache is the operator's (OPENCODE_ENV_CACHE): the command line passes down how to find it, as `cache_dir`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opencode_env.cli.extras import always
from opencode_env.sandbox.local.services import (
    ARCHIVE_PREFIXES,
    BASE_IMAGE,
    MIRROR,
    SUITE,
    BaseImageError,
    ImageBudget,
    ImageStore,
    archive_dir_of,
    build_base_image,
)
from opencode_env.settings import settings_or_exit


def _say(message: str) -> None:
    print(message, file=sys.stderr)


def _cmd_build_base(args: argparse.Namespace) -> int:
    try:
        tag = build_base_image(
            suite=args.suite, mirror=args.mirror, tag=args.tag, force=args.force, say=_say, cache=args.cache_dir()
        )
    except BaseImageError as error:
        print(f"opencode-env image build-base: {error}", file=sys.stderr)
        return 2
    print(tag)
    return 0


def _store(args: argparse.Namespace, archive_dir: Path | None = None) -> ImageStore:
    """The operator's image cache, charged to their image storage budget (the one the local backend charges)."""
    root = args.cache_dir() / "images"
    budget = ImageBudget(root, settings_or_exit().image_storage_mb << 20)
    return ImageStore(root, archive_dir=archive_dir, budget=budget)


def _cmd_prepare(args: argparse.Namespace) -> int:
    store = _store(args, archive_dir_of(args.image))
    prepared = store.prepare(_operator_ref(args.image))
    print(f"{prepared.ref}: {prepared.image_id[:19]} unpacked at {prepared.rootfs} (workdir {prepared.workdir or '/'})")
    return 0


def _operator_ref(ref: str) -> str:
    """The operator's archive path made absolute (the store takes no relative path)."""
    for prefix in ARCHIVE_PREFIXES:
        if ref.startswith(prefix):
            return prefix + os.path.abspath(ref.removeprefix(prefix))
    return ref


def _cmd_prune(args: argparse.Namespace) -> int:
    removed = _store(args).prune()
    for image_id in removed:
        print(image_id)
    print(f"removed {len(removed)} unpacked image(s) no longer in podman's storage", file=sys.stderr)
    return 0


def add_image_parser(subparsers: Any, cache_dir: Callable[[], Path]) -> None:
    """`cache_dir` finds the cache when a command runs (loading the settings then, not when the parser is built)."""
    image = subparsers.add_parser("image", help="the local backend's images (build the base image, prepare one)")
    image.set_defaults(cache_dir=cache_dir, runs_here=always)
    commands = image.add_subparsers(dest="image_command", required=True)
    base = commands.add_parser(
        "build-base",
        help=f"build {BASE_IMAGE} from Debian packages (debootstrap, no registry): what requests naming no image "
        "run on, once built",
    )
    base.add_argument("--suite", default=SUITE)
    base.add_argument("--mirror", default=MIRROR)
    base.add_argument("--tag", default=BASE_IMAGE)
    base.add_argument("--force", action="store_true", help="build again even when the image exists")
    base.set_defaults(handler=_cmd_build_base)
    prepare = commands.add_parser("prepare", help="unpack an image into the cache now, not at its first rollout")
    prepare.add_argument("image", help="a name in podman's storage, oci-archive:PATH or docker-archive:PATH")
    prepare.set_defaults(handler=_cmd_prepare)
    prune = commands.add_parser(
        "prune", help="remove unpacked images that are gone from podman's storage (never one a rollout has mounted)"
    )
    prune.set_defaults(handler=_cmd_prune)
