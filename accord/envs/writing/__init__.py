"""The collaborative writing task (``writing``, MAGRPO's TL;DR and arXiv variants).

- :mod:`.core`: the team reward, the data (Hub, local files, offline corpus) and the prompts;
- :mod:`.task`: the registered task (two writers, or ``single_agent``);
- :mod:`.corpus`: the offline prose corpus cut from Python's bundled documentation.
"""
