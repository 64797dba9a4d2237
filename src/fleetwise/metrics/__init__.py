"""Summaries of simulation runs (spread across seeds: fleetwise.metrics.stats)."""

from fleetwise.metrics.summary import balance, ideal_latency, summarize

__all__ = ["balance", "ideal_latency", "summarize"]
