"""The math task (``math``): reasoner + tool agent on GSM8K, MATH, AIME or reasoning-gym problems.

- :mod:`.answer`: answer extraction and equivalence checks;
- :mod:`.timebox`: the same checks in a helper process with a deadline (what the environment calls);
- :mod:`.data`: the problems (Hub, local files, reasoning-gym) and their splits;
- :mod:`.env`: the registered environment.
"""
