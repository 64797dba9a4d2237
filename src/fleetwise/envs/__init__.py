"""Gymnasium (and PettingZoo) adapters over the simulator and performance model, registered by id.

``import fleetwise.envs`` registers every id with Gymnasium; it needs the ``rl`` extra.
"""

try:
    from gymnasium.envs.registration import register
except ModuleNotFoundError as e:  # (a bare "No module named 'gymnasium'")
    raise ModuleNotFoundError(f"fleetwise.envs needs the rl extra (missing module {e.name!r}): "
                              "pip install -c constraints.txt 'fleetwise[rl]'", name=e.name) from None

register(id="fleetwise/Allocation-v0", entry_point="fleetwise.envs.allocation:AllocationEnv")
register(id="fleetwise/EdgeBatching-v0", entry_point="fleetwise.envs.edge:EdgeBatchingEnv")
register(id="fleetwise/Torta-v0", entry_point="fleetwise.envs.torta:TortaEnv")
register(id="fleetwise/Autoscaling-v0", entry_point="fleetwise.envs.autoscaling:AutoscalingEnv")


def checked_action(space, action):
    """``action`` as the environment reads it, or a ValueError naming the action and the space: a ``Discrete``
    action an integer in range (``12`` of 12 was an IndexError deep in the step, ``-1`` wrapped to the last
    action, ``"3"`` and ``1.7`` were taken); a ``MultiDiscrete`` action integers of its shape, each in range (the
    PettingZoo env took floats modulo the choices); a ``Box`` action of the space's shape and finite (a wrong shape was a
    broadcasting error, NaN was taken as an action). Box values outside the bounds are clipped by the environment,
    as Stable-Baselines3 clips them."""
    import numpy as np
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        a = np.asarray(action)
        if a.shape != () or a.dtype.kind not in "iu" or not space.start <= int(a) < space.start + space.n:
            raise ValueError(f"action {action!r}: expected an integer in {space}")
        return int(a)
    if isinstance(space, spaces.MultiDiscrete):
        a = np.asarray(action)
        lo = np.asarray(space.start)
        if a.shape != space.shape or a.dtype.kind not in "iu" or not ((a >= lo) & (a < lo + space.nvec)).all():
            raise ValueError(f"action {action!r}: expected integers of shape {space.shape} in {space}")
        return a.astype(np.int64)
    if isinstance(space, spaces.Box):
        try:
            a = np.asarray(action, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"action {action!r}: expected an array in {space}") from None
        if a.shape != space.shape or not np.isfinite(a).all():
            raise ValueError(f"action of shape {a.shape}{' with NaN or infinity' if a.shape == space.shape else ''}: "
                             f"expected finite values in {space}")
        return a
    return action


def checked_render_mode(render_mode, where: str):
    """``render_mode`` for an environment that renders nothing (``metadata["render_modes"] == []``): None, or a
    ValueError naming it (``render_mode="human"`` was taken and ignored by one environment and a TypeError in the
    others)."""
    if render_mode is not None:
        raise ValueError(f"{where} render_mode {render_mode!r}: this environment renders nothing (render_modes: [])")
    return None
