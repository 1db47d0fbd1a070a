"""Grid puzzles of AT-GRPO: ``planpath``, ``sudoku``, ``sokoban`` (planner / executor, or with a tool agent).

- :mod:`.grid`: what the three share (move parsing, rendering, generated splits, the puzzle environment base);
- :mod:`.planpath`, :mod:`.sudoku`, :mod:`.sokoban`: the registered environments.
"""
