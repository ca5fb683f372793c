"""Harbor's task format read into rollout requests: task directories, their task.toml and their files."""

from opencode_env.tasks.harbor import HarborTask, TaskFormatError, request_from_task_dir

__all__ = ["HarborTask", "TaskFormatError", "request_from_task_dir"]
