"""Small synthetic tasks for tests and quick runs with tiny random models.

- :mod:`.letters`: ``letters``, a single-turn two-agent task;
- :mod:`.relay`: ``relay``, a turn-based multi-turn environment.
"""
