"""Task formats read into rollout requests: Harbor task directories, and the images their environments build."""

from opencode_env.tasks.harbor import HarborTask, TaskFormatError, request_from_task_dir
from opencode_env.tasks.image_build import BuiltImage, ImageBuilder, ImageBuildError

__all__ = [
    "BuiltImage",
    "HarborTask",
    "ImageBuildError",
    "ImageBuilder",
    "TaskFormatError",
    "request_from_task_dir",
]
