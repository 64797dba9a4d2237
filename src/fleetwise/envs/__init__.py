"""Gymnasium (and PettingZoo) adapters over the simulator and performance model, registered by id.

``import fleetwise.envs`` registers every id with Gymnasium; it needs the ``rl`` extra.
"""

from gymnasium.envs.registration import register

register(id="fleetwise/Allocation-v0", entry_point="fleetwise.envs.allocation:AllocationEnv")
register(id="fleetwise/EdgeBatching-v0", entry_point="fleetwise.envs.edge:EdgeBatchingEnv")
register(id="fleetwise/Torta-v0", entry_point="fleetwise.envs.torta:TortaEnv")
register(id="fleetwise/Autoscaling-v0", entry_point="fleetwise.envs.autoscaling:AutoscalingEnv")
