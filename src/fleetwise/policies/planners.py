"""Planner policies (which region serves the demand of each origin, every planning slot) and TORTA's micro
allocators (which server inside the chosen region serves a request). docs/torta.md.

A planner has ``plan(obs: SlotObs)`` (at the start of each slot) and ``region(origin, view: PlanView) -> int``
(per request); OT planners also expose the slot's transport plan as ``matrix`` (origins x regions, sums to 1).
A micro allocator has ``plan(view, obs)`` (at the start of each slot) and ``pick(region, request, view) ->
server``. Both read a ``PlanView`` (``fleetwise.control.views``: backlogs, which model each server holds) and
never change the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleetwise.control.registry import register_planner
from fleetwise.errors import InputError
from fleetwise.control.views import LONG_TOKENS, PlanView, SlotObs
from fleetwise.policies.transport import transport_plan


@dataclass(frozen=True)
class OTParams:
    """The OT planner's cost weights and solver (TORTA's world config carries the same fields)."""

    reg: float = 0.05  # entropic regularisation of Sinkhorn (costs are normalised to [0, 1])
    exact_ot: bool = False  # ot.emd instead of ot.sinkhorn
    w_latency: float = 1.0
    w_migration: float = 0.5
    w_congestion: float = 1.0


def softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max())
    return z / z.sum()


# --------------------------------------------------------------------------------------------- planners
@register_planner("round_robin")
class RoundRobinPlanner:
    def __init__(self, cfg=None):
        self.k = 0
        self.matrix = None

    def plan(self, obs: SlotObs) -> None:
        pass

    def region(self, origin: int, view: PlanView) -> int:
        self.k += 1
        return (self.k - 1) % view.n


@register_planner("nearest")
class NearestPlanner(RoundRobinPlanner):
    def region(self, origin: int, view: PlanView) -> int:
        return int(origin)


@register_planner("least_loaded")
class LeastLoadedPlanner(RoundRobinPlanner):
    """The region whose servers have the least outstanding work per unit of service speed, now."""

    @staticmethod
    def score(view: PlanView) -> np.ndarray:
        """Outstanding work per unit of service speed of each region (seconds), now."""
        b = view.backlog_s()
        return np.bincount(view.server_region, b * view.server_speed_tps, view.n) / view.region_speed_tps

    def region(self, origin: int, view: PlanView) -> int:
        return int(np.argmin(self.score(view)))


class ResidualPlanner:
    """TORTA's macro layer as a residual on ``least_loaded`` (issue 17: the learned policy contains the rule).

    Per request, the region minimising ``least_loaded``'s score (outstanding work per unit of service speed, now)
    plus a bias that the action sets once per slot: ``BIAS_S x a_r`` seconds for region r (every origin), plus
    ``RTT_WEIGHT x a_n x rtt(origin, r)`` (the pair's network time), plus ``ETA_WEIGHT x a_{n+1} x`` the request's
    expected completion at the region's best server (its backlog + the request's tokens / its speed: what a fast
    GPU saves the request), plus ``UTIL_WEIGHT x a_{n+2} x`` (r's GPU-busy fraction over the last slot - the mean
    over regions): ``a_{n+2} < 0`` packs requests onto regions already at work (servers billed per slot anyway,
    batches with room), ``> 0`` spreads them. The util weight is **size-aware**: ``a_{n+2}`` weighs requests of at
    most ``LONG_TOKENS`` prompt + output tokens, ``a_{n+3}`` longer ones (docs/torta.md: packing long prompts onto
    busy regions queues the short requests behind their prefills). A zero action is ``least_loaded`` exactly,
    decision for decision: the bias is ``+0.0``. An action of ``n + 3`` entries (a checkpoint written before the
    size-aware entry) weighs every request by ``a_{n+2}``, as it was trained.

    ``policy``: a trained policy (``predict(obs_vector) -> action``; an SB3 model or a fleetwise checkpoint's
    numpy policy), or None (the action is set with ``set_action``, e.g. by the environment). ``matrix``: the region
    a request of each origin would go to at the slot start (rows one-hot), what ``POST /v1/plan`` returns;
    ``matrix_long``: the same for a request over ``LONG_TOKENS`` tokens where its util weight differs (else None).

    **The guard** (``long_share_max``; a trained policy's, from its model card's ``training.long_share_max``, or
    given): a slot whose observation says that more of the recent requests were long than ever in the training
    days (``SlotObs.long_share`` above it) is planned by the rule (a zero action; ``guarded`` says so). What the
    policy learned (packing short requests onto busy regions) was learned where long prefills were a minority;
    where they dominate, packing queues the short requests behind them, and the slot observation alone does not
    show it (docs/torta.md, "A guard on the share of long requests"). None, or a
    slot with no share known: no guard."""

    BIAS_S = 2.0
    RTT_WEIGHT = 4.0
    ETA_WEIGHT = 2.0
    UTIL_WEIGHT = 2.0
    LONG_TOKENS = LONG_TOKENS  # a request of more prompt + output tokens is "long": its own util weight, a_{n+3}
    EXTRA = 4  # action entries after the n per-region biases: rtt, eta, util weight (short), util weight (long)
    EXTRA_V1 = 3  # the layout before the long requests' util weight (one util weight for every request)

    def __init__(self, cfg=None, policy=None, temporal: bool = True, long_share_max: float | None = None):
        self.cfg = cfg
        self.policy, self.temporal = policy, temporal
        if long_share_max is None and policy is not None:
            long_share_max = card_long_share_max(policy)
        self.long_share_max = None if long_share_max is None else float(long_share_max)
        self.guarded = False  # this slot's plan is the rule's (the guard; TORTA's day counts such slots)
        self.bias = None  # per region, seconds
        self.w_rtt = 0.0
        self.w_eta = 0.0
        self.w_util = 0.0  # requests of at most LONG_TOKENS tokens
        self.w_util_long = 0.0  # longer ones
        self.matrix = None
        self.matrix_long = None
        self._rtt = None
        self._util_dev = None  # per region: last slot's GPU-busy fraction - its mean over regions

    @staticmethod
    def action_size(n: int) -> int:
        return n + ResidualPlanner.EXTRA

    def set_action(self, a: np.ndarray, n: int | None = None) -> None:
        """``a``: ``n + EXTRA`` entries (``n``, the regions, may be left out), or ``n + EXTRA_V1`` with ``n`` given
        (the layout of older checkpoints: one util weight for every request)."""
        a = np.clip(np.asarray(a, float), -1.0, 1.0)
        n = len(a) - self.EXTRA if n is None else int(n)
        if len(a) - n not in (self.EXTRA, self.EXTRA_V1):
            raise ValueError(f"ResidualPlanner: action of {len(a)} entries for {n} regions, expected "
                             f"{n + self.EXTRA} (or {n + self.EXTRA_V1})")
        self.bias = self.BIAS_S * a[:n]
        self.w_rtt = self.RTT_WEIGHT * float(a[n])
        self.w_eta = self.ETA_WEIGHT * float(a[n + 1])
        self.w_util = self.UTIL_WEIGHT * float(a[n + 2])
        self.w_util_long = self.UTIL_WEIGHT * float(a[n + 3]) if len(a) - n == self.EXTRA else self.w_util

    def scores(self, per: np.ndarray, origin: int, view: PlanView | None = None, rid: int = -1) -> np.ndarray:
        long_ = (view is not None and rid >= 0 and self.w_util != self.w_util_long
                 and view.request_tokens(rid) > self.LONG_TOKENS)
        return self._scores(per, origin, self.w_util_long if long_ else self.w_util, view, rid)

    def _scores(self, per: np.ndarray, origin: int, w_util: float, view: PlanView | None, rid: int) -> np.ndarray:
        if self.bias is None:
            return per
        s = per + self.bias
        if self.w_rtt != 0.0 and self._rtt is not None:
            s = s + self.w_rtt * self._rtt[origin]
        if w_util != 0.0 and self._util_dev is not None:
            s = s + w_util * self._util_dev
        if self.w_eta != 0.0 and view is not None:
            eta = view.backlog_s() + view.request_tokens(rid) / view.server_speed_tps
            best = np.full(view.n, np.inf)
            np.minimum.at(best, view.server_region, eta)
            s = s + self.w_eta * best
        return s

    def plan(self, obs: SlotObs) -> None:
        if self.policy is not None:
            v = np.clip(obs.vector(self.temporal), -1.0, 5.0)
            a, _ = self.policy.predict(v, deterministic=True)
            a = np.asarray(a, float).ravel()
            share, cap = getattr(obs, "long_share", None), self.long_share_max
            self.guarded = cap is not None and share is not None and float(share) > cap
            if self.guarded:
                a = np.zeros_like(a)  # (the zero action: least_loaded)
            self.set_action(a, n=len(obs.backlog_s))
        self._rtt = np.asarray(obs.rtt_s, float)
        u = np.asarray(obs.util, float)
        self._util_dev = u - u.mean()
        n, per = len(obs.backlog_s), np.asarray(obs.backlog_s, float)
        pick = [int(np.argmin(self._scores(per, o, self.w_util, None, -1))) for o in range(n)]
        self.matrix = np.eye(n)[pick] / n
        self.matrix_long = None  # where a request over LONG_TOKENS would go, when its util weight differs
        if self.w_util_long != self.w_util:
            pick = [int(np.argmin(self._scores(per, o, self.w_util_long, None, -1))) for o in range(n)]
            self.matrix_long = np.eye(n)[pick] / n

    def region(self, origin: int, view: PlanView) -> int:
        return int(np.argmin(self.scores(LeastLoadedPlanner.score(view), origin, view, view.request)))


def card_long_share_max(policy) -> float | None:
    """The guard's threshold a trained TORTA policy's model card carries (``training.long_share_max``), or None."""
    card = getattr(policy, "card", None)
    v = (getattr(card, "training", None) or {}).get("long_share_max") if card is not None else None
    try:
        v = float(v) if v is not None else None
    except (TypeError, ValueError):
        return None
    return v if v is not None and 0.0 <= v <= 1.0 else None


@register_planner("least_loaded_pack_short")
class PackShortPlanner(ResidualPlanner):
    """A size-aware rule, written by hand (docs/torta-log.md, "Size-aware packing"): ``least_loaded``, except that
    requests of at most ``LONG_TOKENS`` tokens lean to the regions that were busier than the mean over the last
    slot (``ResidualPlanner``'s fixed action: util weight ``util_action`` for short requests, 0 for long ones and
    every other entry). Short requests gather where servers are already at work, long prompts go to the least
    loaded servers, so the short ones stop queueing behind their prefills. The strongest rule of this level on
    response time and load balance; it saves no cost."""

    def __init__(self, cfg=None, util_action: float = -0.2):
        super().__init__(cfg, None, True)
        self.util_action = float(util_action)

    def plan(self, obs: SlotObs) -> None:
        n = len(obs.backlog_s)
        a = np.zeros(n + self.EXTRA)
        a[n + 2] = self.util_action
        self.set_action(a)
        super().plan(obs)


@register_planner("ot")
class OTPlanner:
    """Requests follow an optimal transport plan from origin demand to target supply weights.

    ``weights``: "action" (set by ``set_action``: the RL agent; a = 0 gives capacity-proportional weights) or
    "free_capacity" (no RL: capacity / (1 + backlog in slots), the reactive OT baseline; not the GPU-busy
    fraction, which says little about spare capacity under continuous batching: a server decoding one sequence is
    as busy as one decoding thirty, and weights of capacity x (1 - busy) swing a region from all to nothing
    between slots). Cost per pair
    (each term scaled to [0, 1]): network RTT + migration (egress USD per GB of the pair, 0 at home) + congestion
    (the target's backlog in slots)."""

    def __init__(self, cfg=None, weights: str = "action"):
        if weights not in ("action", "free_capacity"):  # ('zzz' was taken as "action")
            raise ValueError(f"weights {weights!r}: expected 'action' or 'free_capacity'")
        self.cfg = cfg or OTParams()  # anything with OTParams' fields (TORTA's world config has them)
        self.weights = weights
        self.action = None
        self.matrix = None
        self._sent = None
        self._route = None

    def set_action(self, a: np.ndarray) -> None:
        self.action = np.clip(np.asarray(a, float), -1.0, 1.0)

    def target(self, obs) -> np.ndarray:
        cap = obs.capacity_rps / obs.capacity_rps.sum()
        if self.weights == "free_capacity":
            w = cap / (1.0 + obs.backlog_s / obs.slot_s)
            return w / w.sum()
        a = np.zeros(len(cap)) if self.action is None else self.action
        return softmax(np.log(cap) + 2.0 * a)

    def cost(self, obs) -> np.ndarray:
        cfg = self.cfg
        rtt = obs.rtt_s / max(float(obs.rtt_s.max()), 1e-9)
        eg = obs.egress_usd_per_gb / max(float(obs.egress_usd_per_gb.max()), 1e-9)
        cong = np.clip(obs.backlog_s / obs.slot_s, 0, 5)[None, :] / 5.0
        return cfg.w_latency * rtt + cfg.w_migration * eg + cfg.w_congestion * np.broadcast_to(cong, rtt.shape)

    def plan(self, obs: SlotObs) -> None:
        cap, dem = np.asarray(obs.capacity_rps, float), np.asarray(obs.demand, float)
        # (zero, NaN or negative capacity gave an all-NaN plan, an empty demand history an IndexError; found by
        # fuzzing, 2026-12-06: the service's schema bounds both, this is for code that builds a SlotObs)
        if not (len(cap) and np.isfinite(cap).all() and (cap > 0).all()):
            raise InputError(f"planner {type(self).__name__}: every region's capacity_rps must be finite and > 0")
        if dem.ndim != 2 or len(dem) == 0 or not np.isfinite(dem).all() or (dem < 0).any():
            raise InputError("planner: demand must hold at least the last slot's finite demand per origin")
        d = obs.demand[0] + 1.0  # forecast of the origin marginal: last slot's demand (+1: no empty row)
        a = d / d.sum()
        b = self.target(obs)
        self.matrix = transport_plan(a, b, self.cost(obs), reg=self.cfg.reg, exact=self.cfg.exact_ot)
        self._route = self.matrix / self.matrix.sum(1, keepdims=True)
        self._sent = np.zeros_like(self.matrix)

    def region(self, origin: int, view: PlanView) -> int:
        # deterministic stride: the region furthest behind its planned share of this origin's requests
        sent = self._sent[origin]
        k = sent.sum() + 1.0
        j = int(np.argmax(self._route[origin] * k - sent))
        sent[j] += 1.0
        return j


@register_planner("ot_capacity")
def ot_capacity(cfg=None):
    return OTPlanner(cfg, weights="free_capacity")


class PolicyPlanner(OTPlanner):
    """An OT planner whose weights come from a trained policy (``predict(obs_vector) -> action``): a model in
    memory after training, or ``load_torta_checkpoint``'s numpy policy (a checkpoint that runs no code)."""

    def __init__(self, cfg, policy, temporal: bool):
        super().__init__(cfg, "action")
        self.policy = policy
        self.temporal = temporal

    def plan(self, obs: SlotObs) -> None:
        v = np.clip(obs.vector(self.temporal), -1.0, 5.0)
        a, _ = self.policy.predict(v, deterministic=True)
        self.set_action(np.asarray(a, float))
        super().plan(obs)


def is_residual(policy) -> bool:
    """A TORTA checkpoint whose model card says it adjusts ``least_loaded`` (``ResidualPlanner``)."""
    card = getattr(policy, "card", None)
    return card is not None and card.rule == "least_loaded"


def residual_extra(policy) -> int:
    """Action entries after the per-region biases of a TORTA checkpoint: 0 for an OT planner's, ``EXTRA`` for a
    residual whose card says so (``training.residual_extra``), ``EXTRA_V1`` for one written before."""
    if not is_residual(policy):
        return 0
    extra = (getattr(policy.card, "training", None) or {}).get("residual_extra", ResidualPlanner.EXTRA_V1)
    if extra not in (ResidualPlanner.EXTRA, ResidualPlanner.EXTRA_V1):
        from fleetwise.control.checkpoint import CheckpointError

        raise CheckpointError(f"TORTA checkpoint: training.residual_extra {extra!r} is not "
                              f"{ResidualPlanner.EXTRA} or {ResidualPlanner.EXTRA_V1}")
    return int(extra)


def torta_planner(cfg, policy, temporal: bool):
    """The planner that runs a TORTA checkpoint: ``ResidualPlanner`` or the OT ``PolicyPlanner``."""
    return (ResidualPlanner if is_residual(policy) else PolicyPlanner)(cfg, policy, temporal)


def load_torta_checkpoint(path):
    """A trained TORTA planner agent from its fleetwise checkpoint (``NAME.npz`` + ``NAME.card.json``,
    fleetwise.control.checkpoint; an SB3 .zip is refused, it runs code on load): ``(policy, temporal, history,
    regions)``. The observation layout says which agent it is: ``3 n`` values for the reactive one, ``n (3 +
    history) + 2`` for the temporal one, for ``n`` regions (the action size; ``n + 4`` for a residual on
    ``least_loaded``, whose model card names that rule: ``ResidualPlanner``; ``n + 3`` for one whose card does not
    say ``training.residual_extra``, written before the long requests' util weight)."""
    from fleetwise.control.checkpoint import CheckpointError, load_policy

    pol = load_policy(path, level="planner")
    if pol.action.kind != "box" or len(pol.action.shape) != 1 or len(pol.obs_shape) != 1:
        raise CheckpointError(f"checkpoint {path}: not a TORTA planner (action {pol.action.to_json()})")
    n, d = pol.action.shape[0] - residual_extra(pol), pol.obs_shape[0]
    if n < 1:
        raise CheckpointError(f"checkpoint {path}: action size {pol.action.shape[0]} does not fit a residual planner")
    if d == 3 * n:
        return pol, False, 1, n
    if (d - 2) % n == 0 and (d - 2) // n - 3 >= 1:
        return pol, True, (d - 2) // n - 3, n
    raise CheckpointError(f"checkpoint {path}: observation size {d} does not fit a TORTA planner of {n} regions")


# --------------------------------------------------------------------------------------------- micro layer
class LeastLoadedServer:
    """Within the region: the server that would finish the request first (backlog + its own service time)."""

    def __init__(self, cfg=None):
        self.cfg = cfg

    def plan(self, view: PlanView, obs: SlotObs) -> None:
        pass

    def _eta(self, ix, rid, view: PlanView):
        return view.backlog_s()[ix] + view.request_tokens(rid) / view.server_speed_tps[ix]

    def pick(self, region: int, rid: int, view: PlanView) -> int:
        ix = view.servers_by_region[region]
        return int(ix[np.argmin(self._eta(ix, rid, view))])


class AffinityGreedy(LeastLoadedServer):
    """Greedy affinity-then-least-loaded: the least-loaded server already holding the request's model, unless a
    server of another model would finish it more than ``slack x reload`` sooner; then that one (a switch)."""

    def __init__(self, cfg=None, slack: float = 2.0):
        super().__init__(cfg)
        self.slack = slack

    def pick(self, region: int, rid: int, view: PlanView) -> int:
        ix = view.servers_by_region[region]
        eta = self._eta(ix, rid, view)
        same = view.server_model[ix] == view.request_model(rid)
        best = int(np.argmin(eta))
        if same.any():
            j = int(np.flatnonzero(same)[np.argmin(eta[same])])
            if eta[j] <= eta[best] + self.slack * view.reload_s:
                return int(ix[j])
        return int(ix[best])


def switch_cost(view: PlanView, ix: np.ndarray, model: int) -> np.ndarray:
    """Expected delay a switch adds: the reload, paid by the request and by everything queued at the server."""
    out = view.server_outstanding()[ix]
    return (view.server_model[ix] != model) * view.reload_s * (1.0 + out)


def match(cost: np.ndarray) -> np.ndarray:
    """Minimum-cost matching of rows (tasks) to columns (servers) with SciPy's ``linear_sum_assignment``;
    returns the column of each row (-1 when there are more rows than columns and the row is left out)."""
    from scipy.optimize import linear_sum_assignment

    r, c = linear_sum_assignment(cost)
    out = np.full(cost.shape[0], -1)
    out[r] = c
    return out


class MatchingAllocator(LeastLoadedServer):
    """TORTA's micro layer. At every slot start, a minimum-cost matching of the region's expected demand (one
    task per server, split among the models by last slot's mix) to its servers, with cost = expected completion
    time + switching penalty: each server gets a designated model. Per request: the server minimising expected
    completion + switch cost, where a server designated to the request's model has no switch penalty beyond
    its actual reload."""

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self.designated = None
        self._mix = None

    def plan(self, view: PlanView, obs: SlotObs) -> None:
        nm = len(view.model_shares)
        if self._mix is None:
            self._mix = np.tile(np.asarray(view.model_shares, float), (view.n, 1))
        self.designated = view.server_model.copy()
        back = view.backlog_s()
        for r, ix in enumerate(view.servers_by_region):
            k = len(ix)
            share = self._mix[r] / self._mix[r].sum()
            # tasks: k units of demand split by model share (largest remainder), the busiest model first
            units = np.floor(share * k).astype(int)
            rem = k - units.sum()
            units[np.argsort(-(share * k - units))[:rem]] += 1
            tasks = np.repeat(np.arange(nm), units)
            mean_tok = 1400.0
            cost = np.empty((k, k))
            for t, m in enumerate(tasks):
                eta = back[ix] + mean_tok * max(share[m] * k, 1.0) / view.server_speed_tps[ix]
                cost[t] = eta + (view.server_model[ix] != m) * view.reload_s * 4.0
            col = match(cost)
            for t, c in enumerate(col):
                if c >= 0:
                    self.designated[ix[c]] = tasks[t]
        self._mix = 0.5 * self._mix + 0.5 * self._region_mix(view) + 1e-3

    def _region_mix(self, view: PlanView) -> np.ndarray:
        out = np.zeros((view.n, len(view.model_shares)))
        origin, model = view.recent_arrivals(2000)
        if len(origin):
            np.add.at(out, (origin, model), 1.0)
        return out / np.maximum(out.sum(1, keepdims=True), 1.0)

    def pick(self, region: int, rid: int, view: PlanView) -> int:
        ix = view.servers_by_region[region]
        m = view.request_model(rid)
        eta = self._eta(ix, rid, view) + switch_cost(view, ix, m)
        eta = eta + (self.designated[ix] != m) * 0.25 * view.reload_s  # keep to the slot's model plan
        return int(ix[np.argmin(eta)])


MICRO = {"least_loaded_server": LeastLoadedServer, "affinity_greedy": AffinityGreedy, "match": MatchingAllocator,
         "torta_match": MatchingAllocator}


def make_micro(name: str, cfg=None):
    from fleetwise.errors import InputError

    if name not in MICRO:
        raise InputError(f"unknown micro allocator {name!r}; expected one of: {', '.join(MICRO)}")
    return MICRO[name](cfg)
