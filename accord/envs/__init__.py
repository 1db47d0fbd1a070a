"""Tasks (environments) and their registry. Importing this package registers the built-in tasks."""

# the built-in tasks register themselves on import (this order is the registry's order)
import accord.envs.coding.code  # noqa: F401
import accord.envs.coding.humaneval  # noqa: F401
import accord.envs.cooperation.handoff  # noqa: F401
import accord.envs.cooperation.signalling  # noqa: F401
import accord.envs.maths.env  # noqa: F401
import accord.envs.puzzles.planpath  # noqa: F401
import accord.envs.synthetic.relay  # noqa: F401
import accord.envs.puzzles.sokoban  # noqa: F401
import accord.envs.puzzles.sudoku  # noqa: F401
import accord.envs.synthetic.letters  # noqa: F401
import accord.envs.writing.task  # noqa: F401
from accord.envs.registry import TASKS, Task, TaskError, make_env, make_task, register_task
from accord.envs.protocol import Env, StepResult, is_env
from accord.envs.single_turn import SingleTurnEnv

__all__ = ["TASKS", "Env", "SingleTurnEnv", "StepResult", "Task", "TaskError", "is_env", "make_env", "make_task",
           "register_task"]
