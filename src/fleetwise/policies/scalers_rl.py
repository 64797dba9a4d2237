"""The learned scaler ``rl``: a PPO policy trained on ``fleetwise/Autoscaling-v0`` (fleetwise.learn.autoscaling),
deployed through the same ``Scaler`` protocol as the heuristics. docs/autoscaling.md, "RL scaler".

Needs the ``rl`` extra (gymnasium, stable-baselines3); torch is imported only when a checkpoint is loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fleetwise.control.registry import register_scaler
from fleetwise.errors import InputError
from fleetwise.policies.scaler_features import (
    N_GLOBAL_FEATURES,
    N_GROUP_FEATURES,
    features,
    symmetric_deltas,
    targets_from_action,
)

if TYPE_CHECKING:  # pragma: no cover
    from fleetwise.control.protocols import ScaleObs


@register_scaler("rl")
class RLScaler:
    """A trained Stable-Baselines3 PPO policy (``checkpoint``: its .zip) as a scaler: each epoch
    ``features(obs)`` -> the policy's action (argmax with ``deterministic``) -> per group a change of
    ready + starting replicas (``targets_from_action``: clamped to the group's limits, with the safety rules;
    ``on_demand_floor`` as in training, default 1). The number of groups and of replica changes per group come
    from the checkpoint's spaces."""

    def __init__(self, checkpoint: str, deterministic: bool = True, on_demand_floor: int = 1):
        if int(on_demand_floor) < 0:
            raise ValueError(f"on_demand_floor must be >= 0, got {on_demand_floor}")
        path = Path(str(checkpoint)).expanduser()
        if path.suffix != ".zip" and not path.exists() and path.with_suffix(".zip").exists():
            path = path.with_suffix(".zip")
        if not path.is_file():
            raise InputError(f"scaler 'rl': checkpoint {str(checkpoint)!r} not found (train one: python -m "
                             f"fleetwise.learn.autoscaling train --out PATH.zip)")
        from stable_baselines3 import PPO

        try:
            self.model = PPO.load(str(path), device="cpu")
        except Exception as e:  # a corrupt or foreign file
            raise InputError(f"scaler 'rl': cannot load checkpoint {str(path)!r}: {e}") from None
        shape = self.model.observation_space.shape
        nvec = np.asarray(getattr(self.model.action_space, "nvec", []))
        dim = int(shape[0]) if shape else 0
        self.max_groups = (dim - N_GLOBAL_FEATURES) // N_GROUP_FEATURES
        if (self.max_groups < 1 or dim != self.max_groups * N_GROUP_FEATURES + N_GLOBAL_FEATURES
                or len(nvec) != self.max_groups):
            raise InputError(f"scaler 'rl': {str(path)!r} is not an Autoscaling-v0 policy (observation {shape}, "
                             f"action {self.model.action_space})")
        self.deltas = symmetric_deltas(int(nvec[0]))
        self.deterministic = bool(deterministic)
        self.on_demand_floor = int(on_demand_floor)
        self.checkpoint = str(path)

    def scale(self, obs: ScaleObs) -> dict[str, int]:
        x = features(obs, self.max_groups)
        action, _ = self.model.predict(x, deterministic=self.deterministic)
        return targets_from_action(obs, action, self.deltas, self.on_demand_floor)
