"""Tasks (environments) and their registry. Importing this package registers the built-in tasks."""

from accord.envs import code_atgrpo, code_magrpo, math_env, planpath, relay, sokoban, sudoku, synthetic, writing_task  # noqa: F401
from accord.envs.base import TASKS, Task, TaskError, make_env, make_task, register_task
from accord.envs.protocol import Env, StepResult, is_env
from accord.envs.single_turn import SingleTurnEnv

__all__ = ["TASKS", "Env", "SingleTurnEnv", "StepResult", "Task", "TaskError", "is_env", "make_env", "make_task",
           "register_task"]
