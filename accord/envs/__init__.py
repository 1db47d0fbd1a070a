"""Tasks (environments) and their registry. Importing this package registers the built-in tasks."""

from accord.envs import synthetic, writing_task  # noqa: F401  (registration side effects)
from accord.envs.base import TASKS, Task, TaskError, make_task, register_task

__all__ = ["TASKS", "Task", "TaskError", "make_task", "register_task"]
