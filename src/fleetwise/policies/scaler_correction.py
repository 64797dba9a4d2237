"""The RL scaler's model-level correction of ``slo_aware`` (the ``rl`` scaler with a checkpoint whose model card
says ``training.action: "model_correction"``; trained by ``fleetwise.learn.scaler_cem``). docs/autoscaling.md.

It contains its rule. Per model and scaling epoch, a linear policy maps ``N_FEATURES`` features -- what the
rule sees this epoch (:func:`model_features`) and what the scaler remembers of the model's last hour
(:class:`ModelMemory`) -- to two numbers in [-1, 1], which adjust two of ``slo_aware``'s parameters for that model
in that epoch:

* ``a[0]``, the capacity: the rule's need (``predicted x (1 + headroom) x correction + waiting / drain_s``) is
  multiplied by ``exp(NEED_SCALE x a[0])`` (a factor in [0.74, 1.35]), before the rule's scale-down window;
* ``a[1]``, the zone redundancy: while ``a[1] > 0`` has held for the rule's ``downscale_window_s`` (the same
  wait as any scale-down), the model's capacity is not spread N+1 across zones this epoch (one split over its
  groups, cheapest first); it is spread again at once when ``a[1] <= 0``. A gated policy has a third output,
  which replaces ``a[1]`` while the spread is lifted: one linear rule to lift, another to keep it lifted
  (a linear rule alone cannot say both "lift after 15 calm minutes" and "restore at once on a burst"). A fourth
  output replaces ``a[0]`` while the spread is lifted, and a fifth gates ``a[0]`` outside a lift: the need is
  adjusted there only while the fifth output is > 0 (one linear row cannot hold the need for calm models only, as a
  weight on the hour's calm share needs a bias that then scales every busy model's need; a threshold can).

Zero parameters give ``a = 0``: factor 1 and the redundancy kept, i.e. ``slo_aware`` decision for decision
(``tests/test_scaler_correction.py``). What it can learn is when the rule's insurance (headroom, N+1 across zones)
buys no service level: a model whose demand is a small fraction of one replica, at ease with its SLO, pays for a
second zone's replica that a burst would fill only after a cold start anyway. One epoch's view cannot tell a calm
hour from a lull between bursts, so the memory features can: how much of the last 15 and 60 minutes the model was
calm, whether its spread is lifted now (so a policy can hold a decision: hysteresis), how long ago it was last
restored, and how far the need fell below its 15-minute high (so a policy can hold capacity through a dip, as a
longer scale-down window does). A last feature is what one of the model's replicas costs an hour: a hold keeps
replicas to save reversals, and what it costs is their price. The features carry no time of day and no model name,
so a policy cannot learn a scenario's fault schedule; in a fleet whose models run on GPUs of different prices the
price tells the models apart.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from fleetwise.policies.scalers import SLOAware, model_demand

N_STEP_FEATURES = 7  # bias + 6 (model_features): one epoch's view
N_MEMORY_FEATURES = 5  # ModelMemory
N_MODEL_FEATURES = 1  # what the model's replica costs (price_feature)
N_FEATURES = N_STEP_FEATURES + N_MEMORY_FEATURES + N_MODEL_FEATURES
N_OUTPUTS = 2
N_GATED_OUTPUTS = 3  # a gated policy: a[1] from its own row while the spread is kept, from a third once lifted
N_GATED_HOLD_OUTPUTS = 4  # ... and a[0] from a fourth once lifted
N_HOLD_GATE_OUTPUTS = 5  # ... and a fifth that gates row 0 outside a lift: a[0] acts only while it is > 0
OUTPUT_FORMS = (N_OUTPUTS, N_GATED_OUTPUTS, N_GATED_HOLD_OUTPUTS, N_HOLD_GATE_OUTPUTS)  # the policies' sizes
NEED_SCALE = 0.3  # a[0] = +-1: the need x exp(+-0.3)
ACTION_KIND = "model_correction"  # the model card's training["action"]


def model_features(need: float, unit: float, rps: float, history: tuple, ready: np.ndarray, starting: np.ndarray,
                   waiting: int, busy: np.ndarray, ratios: np.ndarray) -> np.ndarray:
    """What the policy sees of one model in one epoch, ``N_STEP_FEATURES`` values:

    0. 1 (bias);
    1. the rule's need in replicas of the model's largest unit (``need / unit``), /4, at most 2;
    2. the worst p90 / SLO ratio of TTFT and TPOT over its groups (0 when nothing finished), at most 3;
    3. ``log1p(waiting per ready replica) / log1p(100)``;
    4. the mean GPU-busy fraction of its ready replicas (weighted by ready; 0 with none);
    5. the demand trend: (arrivals/s - the mean of the last 4 epochs') per unit, in [-2, 2];
    6. the share of its replicas still starting (cold starts in flight).
    """
    u = unit if unit > 0 and math.isfinite(unit) else 1.0
    nready = int(ready.sum())
    nstart = int(starting.sum())
    q = float(np.max(ratios)) if len(ratios) else 0.0
    hist = [h for h in history[-4:] if h is not None and math.isfinite(h)]
    trend = (rps - (sum(hist) / len(hist))) / u if hist else 0.0
    b = float((np.nan_to_num(busy, nan=0.0, posinf=1.0, neginf=0.0) * ready).sum() / nready) if nready else 0.0
    x = np.array([
        1.0,
        min(max(need, 0.0) / u / 4.0, 2.0),
        min(max(q, 0.0), 3.0),
        math.log1p(max(waiting, 0) / max(nready, 1)) / math.log1p(100.0),
        min(max(b, 0.0), 1.0),
        min(max(trend, -2.0), 2.0),
        nstart / max(nready + nstart, 1),
    ])
    return np.nan_to_num(x, nan=0.0, posinf=2.0, neginf=-2.0)  # (a NaN a producer sent never reaches the policy)


PRICE_SCALE = 20.0  # $ per replica-hour of the price feature's 1


def price_feature(prices: np.ndarray) -> float:
    """12. What one replica of the model costs: the highest price per replica-hour among its groups (the on-demand
    one; spot is cheaper), / ``PRICE_SCALE``, in [0, 2] (0 when no group has a price). A hold keeps replicas that
    a reversal would have released: what it costs is this price, while what it saves, a reversal, is worth the
    same for every model (docs/autoscaling-log.md, "A hold priced by the replica")."""
    p = np.asarray(prices, np.float64)
    p = p[np.isfinite(p) & (p > 0.0)]
    return min(float(p.max()) / PRICE_SCALE, 2.0) if len(p) else 0.0


CALM_NEED_REPLICAS = 0.5  # a calm epoch: the rule's need below half a replica,
CALM_RATIO = 0.8  # the worst p90 / SLO ratio below 0.8, and nothing waiting
SHORT_S, LONG_S, HOLD_S = 900.0, 3600.0, 900.0  # the memory's windows
# epochs a model's memory keeps, each window together: all of LONG_S at epochs of 1 s (a scenario's shortest) or
# longer; a client of the decision service whose clock does not advance cannot grow it past this
MEMORY_EPOCHS = 4096
LIFT_LOG = 100_000  # lifts and restores kept (the latest), a diagnostic


class ModelMemory:
    """What the scaler remembers of one model, ``N_MEMORY_FEATURES`` values appended to :func:`model_features`:

    7. the share of the last 15 minutes' epochs that were calm (the rule's need below ``CALM_NEED_REPLICAS``
       replicas, the worst p90 / SLO ratio below ``CALM_RATIO``, nothing waiting), scaled by how much of the 15
       minutes the scaler has seen (a model seen for 5 minutes has at most 1/3);
    8. the same over the last 60 minutes;
    9. 1 when the model's N+1 spread is lifted now (after the previous epoch), else 0;
    10. the time since the spread was last restored, in hours, at most 1 (1 when it never was);
    11. the need's fall below its high of the last 15 minutes, ``log(high / need) / NEED_SCALE``, in [0, 2]
        (``a[0]`` equal to it holds the need at that high, as a 15-minute scale-down window would).
    """

    __slots__ = ("first", "calm", "needs", "restored")

    def __init__(self, now: float):
        self.first = now
        self.calm: deque = deque(maxlen=MEMORY_EPOCHS)  # (time, calm) of the epochs of the last LONG_S
        self.needs: deque = deque(maxlen=MEMORY_EPOCHS)  # (time, need) of the last HOLD_S
        self.restored = -math.inf

    def features(self, now: float, x: np.ndarray, need: float, lifted: bool) -> np.ndarray:
        calm, needs = self.calm, self.needs
        calm.append((now, x[1] * 4.0 < CALM_NEED_REPLICAS and x[2] < CALM_RATIO and x[3] <= 0.0))
        while calm[0][0] <= now - LONG_S:
            calm.popleft()
        need = need if need > 0.0 and math.isfinite(need) else 0.0
        needs.append((now, need))
        while needs[0][0] <= now - HOLD_S:
            needs.popleft()
        seen = now - self.first
        out = []
        for span in (SHORT_S, LONG_S):
            inside = [c for t, c in calm if t > now - span]
            out.append(sum(inside) / len(inside) * min(1.0, (seen + 1e-9) / span) if inside else 0.0)
        high = max(v for _, v in needs)
        out.append(1.0 if lifted else 0.0)
        out.append(min(1.0, (now - self.restored) / 3600.0))
        out.append(min(2.0, math.log(high / need) / NEED_SCALE) if need > 0.0 else 0.0)
        return np.array(out)


# A gated correction with memory (N_GATED_OUTPUTS rows), written by hand: the warm start of the RL scaler's search
# (fleetwise.learn.scaler_cem, ``init="calm_lift"``; docs/autoscaling.md). It is a linear form of the "calm 20 min,
# restore at 0.7 replicas, 60 min between lifts, 15-min hold" correction of benchmarks/scaler-frontier-probe.py,
# its restore thresholds chosen among three on whole training days (ServeGen days 2-6, docs/autoscaling.md):
# a[0] = the need's fall below its 15-minute high (the need held at that high, at most x 1.35);
# lift (row 1, the spread kept): every epoch of the last 15 minutes calm and the last restore an hour ago or more
#   (20 x_calm15 + 20 x_since_restore > 39.6), then held for the rule's scale-down window (5 more calm minutes);
# keep it lifted (row 2): 1 - x_need / 0.25 - x_waiting / 0.4 - x_ratio / 10 > 0, i.e. restored at once when the
#   need reaches 1 replica or the backlog 0.4, sooner when the worst p90 / SLO ratio is high too.
CALM_LIFT = {"0:11": 1.0,
             "1:7": 20.0, "1:10": 20.0, "1:b": -39.6,
             "2:b": 1.0, "2:1": -4.0, "2:2": -0.1, "2:3": -2.5}


# CALM_LIFT with its hold only while the spread is lifted (N_GATED_HOLD_OUTPUTS rows): outside a lift it is the
# rule exactly, so on traffic with nothing calm it is slo_aware (``init="calm_lift_only"``).
CALM_LIFT_ONLY = {("3:11" if k == "0:11" else k): v for k, v in CALM_LIFT.items()}

# CALM_LIFT with its hold gated (N_HOLD_GATE_OUTPUTS rows; ``init="calm_hold"``): the need is held at its 15-minute
# high while the spread is lifted (row 3) and, outside a lift, only in the hour after a restore (row 4:
# 19 - 20 x_since_restore > 0, i.e. restored less than 57 minutes ago), where a lift's reversal is paid back. A model
# whose spread was never lifted (a busy one, or any model on busy traffic) gets the rule's need exactly. Chosen on
# whole training days 2-6 and the Azure code trace at load 0.7 (benchmarks/scaler-inits-on-days.py) over gates on
# the last hour's calm share, which open on that trace too: CodeLlama is calm there in 57% of the epochs, in lulls
# between bursts, and is never lifted. Without the hold on busy models the lifts' reversals stay, so searches from
# it kept the rule (docs/autoscaling-log.md, "A gated hold"); calm_lift stays the budgets' start.
CALM_HOLD = CALM_LIFT | {"3:11": 1.0, "4:10": -20.0, "4:b": 19.0}
# ... whose hold also acts for a model whose need is above one replica (``init="calm_hold_multi"``; row 4:
# 40 x_need - 40 x_since_restore + 30 > 0: never restored, the need above 1 replica): meant to keep the hold's
# saved reversals on multi-replica models and hold none for a model of one replica or less (Azure code's CodeLlama).
# It does not keep them (test day: +24.8 oscillations a run): a hold acts as the need falls back below a replica
# boundary, where a gate on the current need shuts (docs/autoscaling-log.md, "Where the oscillation clause stands").
CALM_HOLD_MULTI = CALM_HOLD | {"4:1": 40.0, "4:10": -40.0, "4:b": 30.0}
# ... whose hold outside a lift acts for a model whose replica is cheap (``init="calm_price_hold"``; row 4:
# 12 - 20 x_price > 0, a replica below $12 an hour): a hold keeps replicas to save reversals, and a reversal is worth
# the same to the bar for every model while a held replica costs its price. In reproduce platform's fleet the chat
# model's replica (1 x A100, $5.12/h) is held and CodeLlama-34B's (2 x H100, $24.58/h) only while lifted: there the
# gate is the model's identity, by its price (docs/autoscaling-log.md, "A hold priced by the replica").
CALM_PRICE_HOLD = {k: v for k, v in CALM_HOLD.items() if k != "4:10"} | {"4:12": -20.0, "4:b": 12.0}
# ... whose lift also needs a calm last hour (``init="calm_hour_price_hold"``; row 1: 20 x_calm15 + 20 x_calm60 +
# 20 x_since_restore > 59.6, i.e. every epoch of the last hour calm, not only of the last 15 minutes): a lift that is
# restored costs two reversals and the code tenant's bursts that arrive while it lasts, and a calm hour predicts a
# calm next one better than a calm quarter-hour. Chosen on whole training and validation days 2-7 (seed 0; an
# hour at least 90% calm instead gave about calm_price_hold's figures): docs/autoscaling-log.md, "A lift after a
# calm hour".
CALM_HOUR_PRICE_HOLD = CALM_PRICE_HOLD | {"1:8": 20.0, "1:b": -59.6}
# ... whose restore answers the need and the SLO ratio, not a short queue (``init="calm_hour_need_restore"``; row 2's
# weight on the backlog -0.6 instead of -2.5: two or three requests waiting on the one replica left no longer restore
# the spread; the need at 1 replica, a high p90 / SLO ratio or a long queue still do). Every restore is a reversal and
# the next lift often another; a replica ordered for a few queued requests is ready after they are served. Chosen
# on the training days 2-6 (seed 0) among backlog weights -2.5, -1.25 and -0.6: docs/autoscaling-log.md, "A restore on
# the need".
CALM_HOUR_NEED_RESTORE = CALM_HOUR_PRICE_HOLD | {"2:3": -0.6}
# ... whose lift also needs a low need now (``init="calm_hour_low_need"``; row 1's weight on the need -4.57: the
# lift's margin, 0.4 after a calm hour, is gone at a need of 0.35 replica). A calm epoch is one under half a replica;
# while lifted, the code tenant's one replica missed its SLO for 2.5-9.1% of its requests on training days, against
# 0.2-0.4% on the rule's two, and the more traffic the lifted hours carry, the more misses each saved replica-hour
# costs. Chosen on the training days 2-6 (seed 0) among need thresholds 0.15, 0.2,
# 0.25 and 0.35 replica: the largest saving whose attainment loss stays within the training's slack, 0.1 point
# (docs/autoscaling-log.md, "A lift on a low need").
CALM_HOUR_LOW_NEED = CALM_HOUR_NEED_RESTORE | {"1:1": -4.57}


def _ratios(ttft: np.ndarray, slo_ttft: np.ndarray, tpot: np.ndarray, slo_tpot: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        out = []
        for o, s in ((ttft, slo_ttft), (tpot, slo_tpot)):
            ok = np.isfinite(o) & (s > 0.0) & np.isfinite(s)
            out.append(o[ok] / s[ok])
    return np.concatenate(out)


class LinearCorrection:
    """``a = clip(W x + b, -1, 1)``: the policy (``w``: (k, N_FEATURES), ``b``: (k,), k = ``N_OUTPUTS``, or
    ``N_GATED_OUTPUTS`` for a gated policy: one linear rule to lift the spread, another to keep it lifted, as a
    thermostat has one threshold to switch on and another to switch off; 4 or 5 with the hold's rows, module
    docstring)."""

    def __init__(self, w: np.ndarray, b: np.ndarray):
        b = np.asarray(b, np.float64).ravel()
        if len(b) not in OUTPUT_FORMS:
            raise ValueError(f"LinearCorrection: {len(b)} outputs, expected one of {OUTPUT_FORMS}")
        self.w = np.asarray(w, np.float64).reshape(len(b), N_FEATURES)
        self.b = b

    @classmethod
    def zeros(cls, outputs: int = N_OUTPUTS) -> "LinearCorrection":
        return cls(np.zeros((outputs, N_FEATURES)), np.zeros(outputs))

    @classmethod
    def from_spec(cls, spec: dict[str, float], outputs: int = N_GATED_OUTPUTS) -> "LinearCorrection":
        """From ``{"output:feature" | "output:b": value}`` (the others zero), e.g. :data:`CALM_LIFT`."""
        w, b = np.zeros((outputs, N_FEATURES)), np.zeros(outputs)
        for k, v in spec.items():
            o, _, i = k.partition(":")
            if i == "b":
                b[int(o)] = v
            else:
                w[int(o), int(i)] = v
        return cls(w, b)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.clip(self.w @ x + self.b, -1.0, 1.0)


class CorrectedSLOAware(SLOAware):
    """``slo_aware`` whose need and zone redundancy a policy adjusts per model and epoch (module docstring).
    ``policy``: features -> a in [-1, 1]^2 (a :class:`LinearCorrection`, or a loaded checkpoint's ``act``)."""

    def __init__(self, policy=None, **params):
        super().__init__(**params)
        self.policy = policy if policy is not None else LinearCorrection.zeros()
        self._drop_since: dict[str, float] = {}  # model -> when a[1] > 0 began (held since)
        self._drop: dict[str, bool] = {}  # model -> redundancy lifted this epoch
        self._memory: dict[str, ModelMemory] = {}
        self.decisions = 0  # (model, epoch) pairs the policy answered
        # (time, model, lifted): each lift and each restore, the latest LIFT_LOG
        self.lift_log: deque[tuple[float, str, bool]] = deque(maxlen=LIFT_LOG)

    def _state(self) -> tuple[dict, ...]:
        return (*super()._state(), self._drop_since, self._drop, self._memory)

    def _apply(self, model: str, need: float, now: float, x: np.ndarray, price: float) -> float:
        mem = self._memory.get(model)
        if mem is None:
            mem = self._memory[model] = ModelMemory(now)
        was = self._drop.get(model, False)
        a = self.policy(np.concatenate([x, mem.features(now, x, need, was), (price,)]))
        self.decisions += 1
        lift = a[2] if was and len(a) > N_OUTPUTS else a[1]  # (a gated policy: its third output once lifted)
        a0 = a[3] if was and len(a) > N_GATED_OUTPUTS else a[0]  # (and its fourth for a[0])
        if not was and len(a) > N_GATED_HOLD_OUTPUTS and a[4] <= 0.0:  # (its fifth gates a[0] outside a lift)
            a0 = 0.0
        if lift > 0.0:
            since = self._drop_since.setdefault(model, now)
            self._drop[model] = now - since >= self.downscale_window_s
        else:
            self._drop_since.pop(model, None)
            self._drop[model] = False
        if was and not self._drop[model]:
            mem.restored = now
        if was != self._drop[model]:
            self.lift_log.append((now, model, self._drop[model]))
        a0 = float(a0)  # in [-1, 1], whatever a checkpoint's network puts out (NaN: the rule's own need)
        a0 = min(1.0, max(-1.0, a0)) if a0 == a0 else 0.0
        return need * math.exp(NEED_SCALE * a0)  # (a[0] = 0: exactly the need)

    def redundant(self, model: str, now: float) -> bool:
        return super().redundant(model, now) and not self._drop.get(model, False)

    def need_rps(self, model, groups, obs, units):
        need = super().need_rps(model, groups, obs, units)
        rps, waiting, _ = model_demand(groups)
        arr = {k: np.array([getattr(g, k) for g in groups], dtype=np.float64)
               for k in ("ready", "starting", "busy", "ttft_p90_s", "slo_ttft_s", "tpot_p90_s", "slo_tpot_s",
                         "price_usd_per_hour")}
        unit = max((v for v in units.values() if 0 < v < math.inf), default=1.0)
        x = model_features(need, unit, rps, tuple(groups[0].history_rps) if len(groups) else (),
                           np.maximum(arr["ready"], 0), np.maximum(arr["starting"], 0), waiting, arr["busy"],
                           _ratios(arr["ttft_p90_s"], arr["slo_ttft_s"], arr["tpot_p90_s"], arr["slo_tpot_s"]))
        return self._apply(model, need, obs.time_s, x, price_feature(arr["price_usd_per_hour"]))

    def need_cols(self, model, groups, obs, cols, unit, demand):
        need = super().need_cols(model, groups, obs, cols, unit, demand)
        rps, waiting, _ = demand
        u = unit[(unit > 0) & (unit < math.inf)] if unit is not None else np.empty(0)
        hist = cols.values("history_rps")[0] if cols.n else ()
        x = model_features(need, float(u.max()) if len(u) else 1.0, rps, tuple(hist or ()), cols.ints("ready"),
                           cols.ints("starting"), waiting, cols.col("busy"),
                           _ratios(cols.col("ttft_p90_s"), cols.col("slo_ttft_s"), cols.col("tpot_p90_s"),
                                   cols.col("slo_tpot_s")))
        return self._apply(model, need, obs.time_s, x, price_feature(cols.col("price_usd_per_hour")))
