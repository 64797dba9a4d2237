"""Worlds: the settings of the papers fleetwise reproduces, each driving the simulator with its own fleet,
workload and metrics (TORTA's compressed days, DISPPO's edge nodes, Graph-MARL's multi-cloud). A world imports
the simulator and the policies; the Gymnasium/PettingZoo environments in ``fleetwise.envs`` adapt a world to an
agent. Worlds need no Gymnasium, PettingZoo or torch."""
