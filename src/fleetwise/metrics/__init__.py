"""Summaries of simulation runs and their spread across seeds."""

from fleetwise.metrics.stats import mean_ci
from fleetwise.metrics.summary import balance, ideal_latency, summarize

__all__ = ["balance", "ideal_latency", "mean_ci", "summarize"]
