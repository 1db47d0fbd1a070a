"""Tasks (environments) and their registry. Importing this package registers the built-in tasks."""

from accord.envs import planpath, relay, sokoban, sudoku, synthetic, writing_task  # noqa: F401  (registration)
from accord.envs.base import TASKS, Task, TaskError, make_task, register_task
from accord.envs.protocol import Env, StepResult, is_env

__all__ = ["TASKS", "Env", "StepResult", "Task", "TaskError", "is_env", "make_task", "register_task"]
