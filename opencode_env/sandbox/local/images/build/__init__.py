"""Task images built for the local backend: offline, in a box of their own (box.py), cached by the content of their
context (builder.py), with what to do when a base image is missing (hints.py)."""

from opencode_env.sandbox.local.images.build.builder import BuildProgress, BuiltImage, ImageBuilder, ImageBuildError

__all__ = ["BuildProgress", "BuiltImage", "ImageBuildError", "ImageBuilder"]
