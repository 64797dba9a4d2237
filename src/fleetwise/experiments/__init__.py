"""Experiments: specs expanded into runs, local or Ray execution, the DuckDB results store, statistics, report."""

from fleetwise.experiments.spec import ExperimentSpec, Run, expand, load_experiment, parse_experiment
from fleetwise.metrics.stats import CI, aggregate, mean_ci, paired_change
from fleetwise.experiments.store import DEFAULT_DB, Store

__all__ = ["CI", "DEFAULT_DB", "ExperimentSpec", "Run", "Store", "aggregate", "mean_ci", "expand",
           "load_experiment", "paired_change", "parse_experiment"]
