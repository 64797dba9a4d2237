"""fleetwise: decide and learn how an LLM inference fleet spends its GPUs."""

__version__ = "0.1.0"
