"""The learned router ``learned``: least outstanding tokens with a learned, state-dependent correction
(docs/learning.md, "The learned router").

It contains its rule. Each request, a small linear policy maps what the router sees of the fleet
(:func:`route_features`) to three bounded weights ``theta`` in [-1, 1]; the router then picks the candidate with
the lowest

    outstanding_tokens(i) + 512 * theta[0] * waiting(i) + 512 * theta[1] * outstanding(i)
                          + 8192 * theta[2] * kv_used_fraction(i)

With ``theta`` = 0 (a zero action) this is ``least_outstanding_tokens`` exactly, ties included: the rule the
policy starts from and is gated against. The policy is a fleetwise checkpoint (``NAME.npz`` + ``NAME.card.json``,
fleetwise.control.checkpoint: numpy arrays and JSON, nothing that runs code on load), trained by
``fleetwise train router`` (fleetwise.learn.router). Without a ``checkpoint`` the one shipped in the package
(trained on the embedded ``default`` scenario) is used. Cost per request: one pass over the candidates.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np

from fleetwise.control.checkpoint import SUFFIX, ActionSpec, load_policy
from fleetwise.control.registry import register_router
from fleetwise.control.views import RouteView
from fleetwise.errors import InputError

RULE = "least_outstanding_tokens"
N_FEATURES = 5
N_WEIGHTS = 3
# tokens one unit of each per-replica term is worth at theta = 1: a waiting request, an outstanding request, a
# full KV cache
TERM_TOKENS = np.array([512.0, 512.0, 8192.0])
OBS_HIGH = np.full(N_FEATURES, 1e6, dtype=np.float32)
ACTION = ActionSpec("box", shape=(N_WEIGHTS,))
PACKAGED = "learned-router-default"  # in fleetwise/policies/checkpoints/


def packaged_checkpoint() -> Path:
    """The checkpoint shipped in the package (trained with the command in its model card)."""
    return Path(str(resources.files("fleetwise.policies") / "checkpoints" / (PACKAGED + SUFFIX)))


def route_features(view: RouteView, cands, ot: list, wt: list, kv: list) -> list[float]:
    """What the policy sees: the request's prompt (/4096 tokens), and over the candidates (``ot``, ``wt``, ``kv``:
    their outstanding tokens, waiting requests and KV fractions) the mean outstanding tokens (/8192), mean waiting
    requests (/8), mean KV fraction in use, and the spread of outstanding tokens (max - min, /8192)."""
    n = len(cands)
    return [view.prompt_tokens / 4096.0, sum(ot) / n / 8192.0, sum(wt) / n / 8.0, sum(kv) / n,
            (max(ot) - min(ot)) / 8192.0]


def pick(view: RouteView, cands, ot: list, wt: list, kv: list, theta) -> int:
    """The candidate with the lowest corrected score; ``theta`` all zero: least outstanding tokens exactly."""
    n = range(len(cands))
    if not any(theta):
        return cands[min(n, key=ot.__getitem__)]  # the first of the least loaded, as min(cands, key=...) picks
    w0, w1, w2 = (float(t) * float(u) for t, u in zip(theta, TERM_TOKENS))
    out = [view.outstanding(i) for i in cands] if w1 else [0] * len(cands)
    score = [ot[k] + w0 * wt[k] + w1 * out[k] + w2 * kv[k] for k in n]
    return cands[min(n, key=score.__getitem__)]


class LinearRoutePolicy:
    """``theta(features) = clip(W @ features + b, -1, 1)``, in plain Python (3 x 5: faster than numpy here)."""

    def __init__(self, w, b):
        w = np.asarray(w, dtype=np.float64).reshape(N_WEIGHTS, N_FEATURES)
        self.w = w.tolist()
        self.b = np.asarray(b, dtype=np.float64).reshape(N_WEIGHTS).tolist()

    def theta(self, x) -> list[float]:
        return [min(1.0, max(-1.0, sum(wi * xi for wi, xi in zip(row, x)) + bi)) for row, bi in zip(self.w, self.b)]


@register_router("learned")
class LearnedRouter:
    """Least outstanding tokens corrected by a learned policy (module docstring). ``checkpoint``: a fleetwise
    router checkpoint (``NAME.npz``); default: the one shipped in the package."""

    def __init__(self, checkpoint: str | None = None):
        path = packaged_checkpoint() if checkpoint is None else Path(str(checkpoint)).expanduser()
        if not path.name.endswith(SUFFIX) and not path.exists():
            path = path.with_name(path.name + SUFFIX)
        if path.is_dir():
            raise InputError(f"router 'learned': checkpoint {str(path)!r}: a folder, not a checkpoint file (NAME.npz)")
        if not path.is_file():  # (a device, a pipe or a broken link was "not found" too)
            why = "not found" if not path.exists() and not path.is_symlink() else \
                "is a broken link" if not path.exists() else "is not a regular file"
            raise InputError(f"router 'learned': checkpoint {str(path)!r} {why} (train one: fleetwise train "
                             "router --out PATH.npz)")
        model = load_policy(path, level="router")
        if (model.obs_shape != (N_FEATURES,) or model.action.kind != "box" or model.action.shape != (N_WEIGHTS,)
                or len(model.layers) != 1 or model.norm is not None
                or not (np.all(model.act_low == -1) and np.all(model.act_high == 1))):
            raise InputError(f"router 'learned': {str(path)!r} is not a learned-router checkpoint (observation "
                             f"{model.obs_shape}, action {model.action.to_json()})")
        card = model.card
        if card is not None and (card.rule != RULE or card.policy != "learned" or card.level != "router"):
            # (a card naming another rule or policy was served: the gate's result is about something else)
            raise InputError(f"router 'learned': {str(path)!r}: its model card is for {card.level} {card.policy!r} "
                             f"with rule {card.rule!r}, not the learned router (rule {RULE!r})")
        w, b = model.layers[0]  # one linear layer, bounds [-1, 1]: what NumpyPolicy.predict computes, in Python
        self.policy, self.checkpoint = LinearRoutePolicy(w, b), str(path)
        self.card = model.card

    @classmethod
    def from_policy(cls, policy) -> "LearnedRouter":
        """A router around an in-memory policy (``theta(features)``, e.g. :class:`LinearRoutePolicy`): training."""
        r = cls.__new__(cls)
        r.policy, r.checkpoint, r.card = policy, None, None
        return r

    def route(self, view: RouteView) -> int:
        cands = view.candidates()
        if len(cands) == 1:
            return cands[0]
        ot = [view.outstanding_tokens(i) for i in cands]
        wt = [view.waiting(i) for i in cands]
        kv = [view.kv_used_fraction(i) for i in cands]
        return pick(view, cands, ot, wt, kv, self.policy.theta(route_features(view, cands, ot, wt, kv)))
