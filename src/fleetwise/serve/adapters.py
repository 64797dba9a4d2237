"""Policy adapters of the decision service: a registered scaler or planner, or a trained planner from a safe
checkpoint, behind ``scale(ScaleRequest)`` / ``plan(PlanRequest)``; the set of policies in use (``Policies``, swapped
whole on reload); and ``CheckpointFiles``, the rule for which files a client may name (docs/security.md).
The routers' adapter is ``fleetwise.serve.policy``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from fleetwise.control.checkpoint import require_gate, resolve_inside
from fleetwise.control.protocols import GroupState, ScaleObs
from fleetwise.errors import InputError
from fleetwise.serve.policy import RoutePolicy, parse_spec
from fleetwise.serve.schemas import NAN_FIELDS, PlanRequest, RegionState, column_groups

DEFAULT_ROUTER = "least_outstanding_tokens"
DEFAULT_PLANNER = "ot_capacity"


def _torta():
    """TORTA's slot observation and config: ``/v1/plan``'s one import of them."""
    from fleetwise.control.views import SlotObs
    from fleetwise.worlds.torta import TortaConfig

    return SlotObs, TortaConfig


class CheckpointFiles:
    """Which checkpoint files may be loaded. With a ``folder`` (``--checkpoint-dir``): only files whose real path
    (symlinks followed) lies inside it, relative names resolving inside it. Without one: paths given at start
    (``trusted``, the operator's command line) load as given; a client's reload by path is refused."""

    def __init__(self, folder: str | Path | None, trusted: bool = False):
        self.folder = None if folder is None else Path(folder)
        self.trusted = trusted

    def resolve(self, name: str) -> Path:
        if self.folder is None and self.trusted:
            return Path(name).expanduser()
        return resolve_inside(self.folder, name)

    def for_clients(self) -> "CheckpointFiles":
        return CheckpointFiles(self.folder, trusted=False)


# --------------------------------------------------------------------------------------------- policies
class PolicyFailed(Exception):
    """A policy could not decide on a valid request (answered 422 with the message)."""


class ScalePolicy:
    def __init__(self, scaler: Any, name: str):
        self.scaler, self.name = scaler, name
        self._lock = threading.Lock()

    def scale(self, body: BaseModel) -> dict[str, int]:
        groups = []
        nan = float("nan")
        rows = (dict(g.__dict__) for g in body.groups) if body.groups is not None else column_groups(body.columns)
        for d in rows:  # the validated fields (no serialisation pass: 10,000 groups are common)
            for k in NAN_FIELDS:
                if d[k] is None:  # null: unknown (NaN)
                    d[k] = nan
            d["history_rps"] = tuple(d["history_rps"])
            groups.append(GroupState(**d))
        return self.decide(ScaleObs(time_s=body.time_s, epoch_s=body.epoch_s, groups=groups))

    def decide(self, obs: ScaleObs) -> dict[str, int]:
        """The scaler's targets for a validated observation (``serve.scale_wire`` decodes one straight from JSON)."""
        with self._lock:
            out = self.scaler.scale(obs)
        if not isinstance(out, dict):
            raise PolicyFailed(f"scaler {self.name!r} returned {type(out).__name__}, expected {{group key: replicas}}")
        if set(map(type, out)) <= {str} and set(map(type, out.values())) <= {int}:  # as a rule (one C-level pass)
            return out
        try:
            return {str(k): int(v) for k, v in out.items()}
        except (TypeError, ValueError, OverflowError) as e:
            raise PolicyFailed(f"scaler {self.name!r} returned a non-integer target: {e}") from None


def load_scale_policy(spec: str, files: CheckpointFiles | None = None, force: bool = False) -> ScalePolicy:
    """A registered scaler by spec (``name?param=value``). A ``checkpoint`` parameter (the scaler ``rl``) names a
    file: ``files`` resolves it (inside the checkpoint folder); None: the path as given (a trusted caller). A
    learned scaler whose checkpoint did not pass the deployment gate is refused unless ``force``."""
    from fleetwise.policies import make

    name, params = parse_spec(spec)
    if files is not None and "checkpoint" in params:
        params["checkpoint"] = str(files.resolve(str(params["checkpoint"])))
    scaler = make("scaler", name, params, where="scaler: ")
    if "checkpoint" in params:  # a learned scaler: its checkpoint's model card must say it passed the gate
        card = getattr(getattr(scaler, "model", None), "card", None)
        require_gate(card, f"scaler {name!r}: checkpoint {Path(str(params['checkpoint'])).name}", force)
    return ScalePolicy(scaler, spec.strip())


def _missing_extra(e: ModuleNotFoundError, extra: str = "rl") -> InputError:
    return InputError(f"this needs the {extra} extra (missing module {e.name!r}): "
                      f"pip install -c constraints.txt 'fleetwise[{extra}]'")


class PlanPolicy:
    """An OT planner of policies/planners.py on one slot: per-origin demand to per-region target weights."""

    def __init__(self, planner: Any, name: str, regions: int | None = None, history: int = 1):
        self.planner, self.name = planner, name
        self.regions = regions  # a checkpoint plans for exactly this many regions (= origins)
        self.history = max(int(history), 1)
        self._lock = threading.Lock()

    def obs(self, req: PlanRequest):
        import numpy as np

        SlotObs, _ = _torta()
        m, n = len(req.origins), len(req.regions)
        if self.regions is not None and not (m == n == self.regions):
            raise PolicyFailed(f"planner {self.name!r} was trained on {self.regions} regions (each also an origin, "
                               f"in the same order); got {m} origins and {n} regions")
        rows = [req.demand_rps, *req.demand_history][: self.history]
        rows += [rows[-1]] * (self.history - len(rows))  # short history: repeat the oldest slot given
        util = np.array([r.util for r in req.regions], float)
        free = np.array([1.0 - r.util if r.free_frac is None else r.free_frac for r in req.regions], float)
        eg = np.zeros((m, n)) if req.egress_usd_per_gb is None else np.asarray(req.egress_usd_per_gb, float)
        return SlotObs(slot=0, hour_utc=req.hour_utc, backlog_s=np.array([r.backlog_s for r in req.regions], float),
                       util=util, free_frac=free, demand=np.asarray(rows, float) * req.slot_s,
                       capacity_rps=np.array([r.capacity_rps for r in req.regions], float),
                       rtt_s=np.asarray(req.rtt_s, float), egress_usd_per_gb=eg, slot_s=req.slot_s,
                       long_share=req.long_share)

    def plan(self, req: PlanRequest) -> dict[str, Any]:
        import numpy as np

        obs = self.obs(req)
        with self._lock:
            self.planner.plan(obs)
            mat = None if self.planner.matrix is None else np.array(self.planner.matrix, float)
            long_ = getattr(self.planner, "matrix_long", None)
            long_ = None if long_ is None else np.array(long_, float)
            target = np.asarray(self.planner.target(obs), float) if hasattr(self.planner, "target") else None
            guarded = bool(getattr(self.planner, "guarded", False))
        shape = (len(req.origins), len(req.regions))
        if any(m is not None and (m.shape != shape or not np.isfinite(m).all()) for m in (mat, long_)) or mat is None:
            raise PolicyFailed(f"planner {self.name!r} gave no valid transport plan for this slot")

        def row_shares(m):
            rs = m.sum(1, keepdims=True)
            sh = np.divide(m, rs, out=np.full_like(m, 1.0 / m.shape[1]), where=rs > 0)
            return sh / sh.sum(1, keepdims=True)

        shares = row_shares(mat)
        plan = np.asarray(req.demand_rps, float)[:, None] * shares
        if target is None:
            target = mat.sum(0) / max(mat.sum(), 1e-300)
        return {"origins": list(req.origins), "regions": [r.name for r in req.regions], "plan_rps": plan.tolist(),
                "shares": shares.tolist(), "shares_long": None if long_ is None else row_shares(long_).tolist(),
                "target": target.tolist(), "guarded": guarded, "policy": self.name}


def _probe_plan(p: PlanPolicy) -> PlanPolicy:
    """Check at load time that the planner produces a transport plan (a 2-region slot)."""
    n = p.regions or 2
    req = PlanRequest(origins=[f"o{i}" for i in range(n)], demand_rps=[1.0] * n,
                      regions=[RegionState(name=f"r{i}", capacity_rps=1.0) for i in range(n)],
                      rtt_s=[[0.0 if i == j else 0.05 for j in range(n)] for i in range(n)])
    try:
        p.plan(req)
    except PolicyFailed:
        raise InputError(f"planner {p.name!r} does not produce a transport plan; use ot, ot_capacity or "
                         f"--checkpoint") from None
    return p


def load_plan_policy(spec: str | None = None, checkpoint: str | None = None, force: bool = False) -> PlanPolicy:
    """A registered planner (``ot``, ``ot_capacity``, ...) or a TORTA agent from its fleetwise checkpoint (``.npz``
    + model card, as written by learn/export.py after training; never an SB3 .zip): its action sets the OT target
    weights; otherwise free-capacity weights. ``checkpoint`` is loaded as given: the service resolves it inside its
    checkpoint folder first (``CheckpointFiles``). A checkpoint that did not pass the deployment gate (its model card)
    is refused unless ``force``."""
    from fleetwise.policies import make

    try:
        if checkpoint is not None:
            return _probe_plan(_plan_from_checkpoint(checkpoint, force))
        name, params = parse_spec(spec or DEFAULT_PLANNER)
        planner = make("planner", name, params, where="planner: ")
        return _probe_plan(PlanPolicy(planner, (spec or DEFAULT_PLANNER).strip()))
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("fleetwise"):
            raise
        raise _missing_extra(e) from None


def _plan_from_checkpoint(path: str, force: bool = False) -> PlanPolicy:
    from fleetwise.policies.planners import load_torta_checkpoint, torta_planner

    p = Path(path)
    policy, temporal, history, regions = load_torta_checkpoint(p)
    card = getattr(policy, "card", None)
    if card is not None and (card.level != "planner" or card.rule not in (None, "least_loaded")):
        raise InputError(f"checkpoint {p.name}: its model card is for {card.level} {card.policy!r} with rule "
                         f"{card.rule!r}, not a TORTA planner (rule 'least_loaded')")
    require_gate(card, f"checkpoint {p.name}", force)
    _, TortaConfig = _torta()
    cfg = TortaConfig(temporal=temporal, history=history)
    return PlanPolicy(torta_planner(cfg, policy, temporal), f"checkpoint:{p.name}", regions=regions, history=history)


class Policies:
    """The policies in use. Calls take one reference at their start; a reload replaces the whole object."""

    __slots__ = ("route", "scale", "plan", "plan_error")

    def __init__(self, route: RoutePolicy, scale: ScalePolicy | None, plan: PlanPolicy | None,
                 plan_error: str | None = None):
        self.route, self.scale, self.plan, self.plan_error = route, scale, plan, plan_error
