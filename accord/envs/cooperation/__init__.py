"""Tasks in which cooperation is necessary: the best team reward needs what the partner writes.

- :mod:`.signalling`: ``signal``, a referential game (the listener names a secret only the speaker sees);
- :mod:`.handoff`: ``handoff``, the second agent continues a path from where the first stopped.

Both are small enough for a tiny random model to learn in a few dozen steps (their texts are read
by :mod:`.items`), and their local rewards, which independent learners train on, read neither the
secret nor the partner. docs/tasks-cooperation.md describes them.
"""
