"""Tasks in which cooperation is necessary: the best team reward needs what the partner writes.

- :mod:`.signalling`: ``signal``, a referential game (the listener names a secret only the speaker sees);
- :mod:`.handoff`: ``handoff``, the second agent continues a path from where the first stopped.

Their texts are read by :mod:`.items` (dense, hedge-proof scores), and their local rewards, which
independent learners train on, read neither the secret nor the partner. docs/tasks-cooperation.md
describes them, with what a tiny random model learns of each.
"""
