"""accord: multi-agent RL for cooperating LLM agents."""
__version__ = "0.1.0"
