"""The discrete-event fleet simulator: event loop, replica engine, records."""

from fleetwise.sim.build import make_replica
from fleetwise.sim.engine import Lane, Replica
from fleetwise.sim.records import REJECT_REASONS, Records
from fleetwise.sim.simulator import SimOptions, Simulator

__all__ = ["Lane", "REJECT_REASONS", "Records", "Replica", "SimOptions", "Simulator", "make_replica"]
