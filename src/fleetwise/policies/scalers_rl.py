"""The learned scaler ``rl``: a PPO policy trained on ``fleetwise/Autoscaling-v0`` (fleetwise.learn.autoscaling),
deployed through the same ``Scaler`` protocol as the heuristics. docs/autoscaling.md, "RL scaler"; docs/learning.md.

It contains its rule, in one of two ways (the model card's ``training.action``):

* ``residual`` (PPO on ``fleetwise/Autoscaling-v0``): each epoch ``slo_aware`` (with the parameters the model card
  names) answers first, and the policy's action corrects its target per group by a bounded number of replicas;
  the centre action reproduces ``slo_aware`` decision for decision;
* ``model_correction`` (CEM, ``fleetwise.learn.scaler_cem``): per model and epoch a linear policy adjusts two of
  ``slo_aware``'s parameters, its need and its zone redundancy (``policies/scaler_correction.py``); zero
  parameters reproduce ``slo_aware`` decision for decision.

The policy is a fleetwise policy checkpoint (``NAME.npz`` + ``NAME.card.json``, fleetwise.control.checkpoint) run
in numpy: loading it runs no code from the file and needs neither torch nor Stable-Baselines3. Training writes
one beside its SB3 ``.zip``; ``fleetwise export-checkpoint`` exports an older ``.zip`` (yours only: it unpickles).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fleetwise.control.checkpoint import SUFFIX, CheckpointError, load_policy
from fleetwise.control.registry import register_scaler
from fleetwise.errors import InputError
from fleetwise.policies.scaler_correction import ACTION_KIND as CORRECTION
from fleetwise.policies.scaler_features import (
    N_GLOBAL_FEATURES,
    N_GROUP_FEATURES,
    RULE,
    check_deltas,
    features,
    residual_targets,
    symmetric_deltas,
)

if TYPE_CHECKING:  # pragma: no cover
    from fleetwise.control.protocols import ScaleObs


@register_scaler("rl")
class RLScaler:
    """A trained PPO policy (``checkpoint``: its fleetwise checkpoint, ``NAME.npz`` or ``NAME``) as a scaler: each
    epoch the rule (``slo_aware`` with the card's ``training.rule_params``) answers, then ``features(obs, rule
    targets)`` -> the policy's deterministic action (per-group argmax) -> per group a change of the rule's target
    (``residual_targets``: clamped to the group's limits, with the safety rules; ``on_demand_floor`` as in
    training, default 1). The number of groups and of replica changes per group come from the checkpoint's
    spaces. A checkpoint of the old action (changes of the current replicas, no rule) is refused, one line."""

    def __init__(self, checkpoint: str, deterministic: bool = True, on_demand_floor: int = 1):
        if int(on_demand_floor) < 0:
            raise ValueError(f"on_demand_floor must be >= 0, got {on_demand_floor}")
        if not deterministic:
            raise ValueError("deterministic must be true (a served policy acts deterministically)")
        path = Path(str(checkpoint)).expanduser()
        if path.suffix == ".zip" and path.exists():
            hint = f" (its export is {path.with_suffix(SUFFIX)})" if path.with_suffix(SUFFIX).is_file() else ""
            raise InputError(f"{str(path)!r} is a Stable-Baselines3 zip, which runs code when loaded; "
                             f"give the fleetwise checkpoint NAME.npz{hint} (export one with `fleetwise "
                             "export-checkpoint`, only for files you trust)")
        if not path.name.endswith(SUFFIX) and not path.exists():
            path = path.with_name(path.name + SUFFIX)
        if path.is_dir():
            raise InputError(f"checkpoint {str(checkpoint)!r}: a folder, not a checkpoint file (NAME.npz)")
        if not path.is_file():
            raise InputError(f"checkpoint {str(checkpoint)!r} not found (train one: fleetwise train scaler "
                             "--out PATH.npz)")
        self.model = load_policy(path, level="scaler")
        card = self.model.card
        if card is not None and (card.level != "scaler" or card.policy != "rl"):  # (a card for another policy
            # loaded: the gate's result was about something else)
            raise CheckpointError(f"{str(path)!r}: its model card is for {card.level} {card.policy!r}, not the rl "
                                  "scaler")
        training = card.training if card is not None else {}
        kind = training.get("action") if card is not None and card.rule == RULE else None
        if kind not in ("residual", CORRECTION):
            raise CheckpointError(f"{str(path)!r} is an RL scaler of the old action (replica changes "
                                  f"without a rule; its card names rule {None if card is None else card.rule!r}): "
                                  f"this fleetwise's rl scaler corrects {RULE}'s targets; retrain it (python -m "
                                  "fleetwise.learn.autoscaling train)")
        rule_params = training.get("rule_params") or {}
        if not isinstance(rule_params, dict):
            raise CheckpointError(f"{str(path)!r}: model card training.rule_params must be an object")
        from fleetwise.policies import make

        self.rule = make("scaler", RULE, dict(rule_params), where=f"{path.name}'s rule: ")
        self.checkpoint = str(path)
        self.deterministic = True
        self.correction = None
        if kind == CORRECTION:
            self._init_correction(path, rule_params)
            return
        shape = self.model.obs_shape
        act = self.model.action
        dim = int(shape[0]) if len(shape) == 1 else 0
        self.max_groups = (dim - N_GLOBAL_FEATURES) // N_GROUP_FEATURES
        if (act.kind != "multi_discrete" or self.max_groups < 1
                or dim != self.max_groups * N_GROUP_FEATURES + N_GLOBAL_FEATURES or len(act.nvec) != self.max_groups
                or len(set(act.nvec)) != 1):
            raise InputError(f"{str(path)!r} is not an Autoscaling-v0 policy (observation {shape}, "
                             f"action {act.to_json()})")
        n = int(act.nvec[0])
        d = training.get("deltas")  # (the card names them; a checkpoint without: centred on 0)
        self.deltas = symmetric_deltas(n) if d is None else check_deltas(d, f"{path.name}: model card training.deltas")
        if len(self.deltas) != n:
            raise CheckpointError(f"{str(path)!r}: model card training.deltas has {len(self.deltas)} changes, its "
                                  f"action {n} choices per group")
        self.on_demand_floor = int(on_demand_floor)

    def _init_correction(self, path: Path, rule_params: dict) -> None:
        """A model-level correction of ``slo_aware`` (policies/scaler_correction.py, trained by CEM); the rule's
        parameters were checked by building the rule."""
        from fleetwise.policies.scaler_correction import (
            N_FEATURES,
            N_MODEL_FEATURES,
            N_OUTPUTS,
            N_STEP_FEATURES,
            OUTPUT_FORMS,
            CorrectedSLOAware,
        )

        m = self.model
        # (a checkpoint from before the memory features, or before the price feature, reads the first ones)
        n_in = tuple(m.obs_shape)[0] if len(tuple(m.obs_shape)) == 1 else -1
        # (a gated policy has a third output: a[1] once the spread is lifted; it needs the memory features)
        outs = tuple(m.action.shape)
        if (m.action.kind != "box" or outs not in [(k,) for k in OUTPUT_FORMS]
                or n_in not in (N_FEATURES, N_FEATURES - N_MODEL_FEATURES, N_STEP_FEATURES)
                or (outs != (N_OUTPUTS,) and n_in == N_STEP_FEATURES)
                or len(m.layers) != 1 or m.act_low is None or m.act_high is None):
            raise InputError(f"{str(path)!r} is not a model-correction policy (observation "
                             f"{m.obs_shape}, action {m.action.to_json()}, {len(m.layers)} layers)")
        lo, hi = m.act_low, m.act_high

        def act(x):
            return np.clip(m.forward(x[:n_in].reshape(1, -1))[0], lo, hi)

        self.correction = self.rule = CorrectedSLOAware(act, **rule_params)

    def scale(self, obs: ScaleObs) -> dict[str, int]:
        if self.correction is not None:
            return self.correction.scale(obs)
        rule = {str(k): int(v) for k, v in self.rule.scale(obs).items()}
        x = features(obs, self.max_groups, rule)
        action, _ = self.model.predict(x)
        return residual_targets(obs, action, self.deltas, rule, self.on_demand_floor)
