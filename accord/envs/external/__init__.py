"""Other libraries' environments as accord tasks: ``pettingzoo:<env_id>``, ``textarena:<env_id>`` and
``gymnasium:<env_id>`` (see :mod:`accord.envs.external.base` for what they share, and docs/pettingzoo.md).

The adapters import their library only when such a task is built (``pip install 'accord[envs]'``).
"""
