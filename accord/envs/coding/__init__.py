"""Code tasks, run in the sandbox.

- :mod:`.common`: code extraction and normalisation, test splitting, the cached test runs;
- :mod:`.data`: HumanEval, CoopHumanEval and MBPP problems (package, Hub or local files) and their splits;
- :mod:`.humaneval`: ``humaneval``, helper + main writing one function (single-turn, or multi-turn with feedback);
- :mod:`.code`: ``code``, the coder + tester environment of AT-GRPO.
"""
