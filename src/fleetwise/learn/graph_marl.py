"""Graph-MARL: a heterogeneous GNN encoder (PyTorch Geometric ``HeteroConv`` of ``GATv2Conv``) shared by four
cooperative agents, trained with MAPPO (decentralized actors, a centralized value on the global state).

What is library code and what is written here:
- The graph layers are PyG's ``HeteroConv`` + ``GATv2Conv`` (edge attributes enter the attention).
- The MAPPO update (clipped surrogate per agent on the shared team advantage, GAE, value clipping off) is
  written here, compactly, after CleanRL's ``ppo.py``: TorchRL (which has a maintained MAPPO) is not installed.

Three variants share the training loop (``kind``):
- ``graph``: GNN encoder; each agent's logits are read from the embeddings of the nodes it decides for
  (request-class nodes for cloud / model / router, pool nodes for GPU allocation), so the actor's size does not
  grow with the graph. Value: an MLP on ``env.state()`` (centralized critic).
- ``flat``: the same MAPPO, actors an MLP on the flattened node-feature matrix (the "MARL baseline").
- ``ippo``: independent PPO: one flat actor and one critic on its own observation per agent, no shared
  parameters and no centralized value.

Checkpoints (``ckpt_path``) hold the networks, the optimizer, the update counter, the learning curve and the
random generator state; they are written to a temporary file and moved into place with ``os.replace`` (atomic),
every ``ckpt_every`` updates. ``train(..., resume=True)`` continues from the last one: episode seeds depend only
on the update counter and the sampling generator is restored, so a killed run resumed gives the same network as
an uninterrupted one.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from fleetwise.envs.graph_marl import AGENTS, EDGE_TYPES, F_EDGE, F_NODE, NODE_TYPES, GraphLayout
from fleetwise.errors import InputError
from fleetwise.floats import check_torch


@dataclass
class MAPPOArgs:
    kind: str = "graph"  # graph | flat | ippo
    updates: int = 30
    episodes_per_update: int = 4
    train_segment_s: float = 300.0
    gamma: float = 0.95  # per epoch
    gae_lambda: float = 0.9
    learning_rate: float = 1e-3
    n_epochs: int = 6
    minibatch_size: int = 40
    clip_coef: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    # stop an update's epochs once an agent's approximate KL divergence from the rollout's policy passes 1.5 x this
    # (Stable-Baselines3's ``target_kl``; None: never); ``info["kl"]`` keeps each update's largest one
    target_kl: float | None = None
    # after this many validation checks in a row below the warm start's score (the rule's), training restarts from
    # the best parameters found so far, with a fresh optimizer and the multipliers at 0 (0: never; a run caught
    # where every class misses its floor and every multiplier sits at its cap learns nothing more: docs/graph-marl.md)
    rollback_checks: int = 0
    hidden: int = 32
    gnn_layers: int = 2
    ckpt_every: int = 5
    hold_bias: float = 2.0  # initial logit bias of every agent's action 0 ("the rule's decision")
    # the shared recipe (fleetwise.learn.recipe, docs/learning.md)
    bc_episodes: int = 2  # warm start: rule episodes for behaviour cloning (0: none)
    bc_target: float = 0.9  # ... until the rule's action has this mean probability per factor
    bc_max_steps: int = 200
    slo_target: float | None = None  # per-class SLO attainment floor (None: the rule's on the BC episodes - 0.01)
    # the tail as a constraint as well (None: none): per class, the share of ended requests whose TTFT is at most a
    # target is at least ``tail_quantile`` -- the class's ``tail_quantile`` quantile of TTFT at most the target (a
    # dropped request is over it). The target: the rule's quantile on the BC episodes x ``tail_scale``. A multiplier
    # per class, after the SLO floor's (``info["lagrange"]``: the floors, then the tails)
    tail_quantile: float | None = None
    tail_scale: float = 1.0
    lagrange_lr: float = 2.0  # dual ascent step of the per-class multipliers (recipe.Lagrangian)
    lagrange_max: float = 20.0
    val_every: int = 5  # validation (checkpoint choice, early stopping) every this many updates (0: never)
    patience: int = 8  # 4 stopped graph_marl and ippo at update 20, where flat_marl first improved (docs)
    # the first epochs of every episode are the rule's (in training, validation and evaluation): the policy first
    # decides with that many epochs of the segment's traffic observed, not on a cold fleet (docs/graph-marl.md)
    rule_start_epochs: int = 0
    seed: int = 0


def _sizes(env) -> dict:
    """Per agent: (number of factors, choices per factor)."""
    return {a: (len(env.action_space(a).nvec), int(env.action_space(a).nvec[0])) for a in AGENTS}


def _torch():
    import torch

    torch.set_num_threads(1)
    check_torch(torch)  # the kernels pinned at import (fleetwise/floats.py)
    return torch


def _drop_generated_sources() -> None:
    """Remove the source files PyG generated in this process. A ``MessagePassing`` class's first instance in a
    process renders its ``propagate`` and ``edge_updater`` from a template into a temporary ``.py`` file, imports it
    and never deletes it (``torch_geometric.template.module_from_template``, ``delete=False``): two files in
    ``$TMPDIR`` per process that builds a Graph-MARL actor. The modules are imported by then and nothing reads
    their source again (no TorchScript here), so the files go."""
    import os
    import sys
    import tempfile

    tmp = os.path.realpath(tempfile.gettempdir())
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None) if name.startswith("torch_geometric.") else None
        if path and os.path.dirname(os.path.realpath(path)) == tmp and os.path.basename(path).startswith(name + "_"):
            try:
                os.unlink(path)
            except OSError:
                pass


def build_networks(kind: str, layout: GraphLayout, sizes: dict, state_dim: int, hidden: int = 32,
                   gnn_layers: int = 2):
    torch = _torch()
    nn = torch.nn
    if kind not in ("graph", "flat", "ippo"):
        raise InputError(f"graph-marl kind {kind!r}: expected graph, flat or ippo")
    N = layout.num_nodes

    def mlp(i, o):
        return nn.Sequential(nn.Linear(i, hidden * 2), nn.Tanh(), nn.Linear(hidden * 2, hidden * 2), nn.Tanh(),
                             nn.Linear(hidden * 2, o))

    class Critic(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.net = mlp(d, 1)

        def forward(self, s):
            return self.net(s).squeeze(-1)

    class FlatActor(nn.Module):
        def __init__(self, agents):
            super().__init__()
            self.agents = agents
            self.trunk = nn.Sequential(nn.Linear(N * F_NODE, hidden * 2), nn.Tanh(), nn.Linear(hidden * 2, hidden * 2),
                                       nn.Tanh())
            self.heads = nn.ModuleDict({a: nn.Linear(hidden * 2, sizes[a][0] * sizes[a][1]) for a in agents})

        def forward(self, x, ea):
            h = self.trunk(x.reshape(x.shape[0], -1))
            return {a: self.heads[a](h).reshape(x.shape[0], *sizes[a]) for a in self.agents}

    class GraphActor(nn.Module):
        """Per-type input projections, ``gnn_layers`` HeteroConv(GATv2) layers over the edges and their
        reverses, then per-agent heads on class / pool node embeddings."""

        def __init__(self):
            super().__init__()
            from torch_geometric.nn import GATv2Conv, HeteroConv

            self.inp = nn.ModuleDict({t: nn.Linear(F_NODE, hidden) for t in NODE_TYPES})
            rels = []
            for s, r, d in EDGE_TYPES:
                rels.append((s, r, d))
                if s != d:
                    rels.append((d, "rev_" + r, s))
            self.rels = rels
            self.convs = nn.ModuleList([
                HeteroConv({rel: GATv2Conv(hidden, hidden, heads=1, edge_dim=F_EDGE, add_self_loops=False)
                            for rel in rels}, aggr="sum") for _ in range(gnn_layers)])
            _drop_generated_sources()
            self.heads = nn.ModuleDict({a: nn.Linear(2 * hidden, sizes[a][1]) for a in AGENTS})
            self._cache: dict = {}

        def _edges(self, lay: GraphLayout, B: int):
            key = (id(lay), B)
            if key not in self._cache:
                out = {}
                ei, et = lay.edge_index, lay.edge_type
                for k, (s, r, d) in enumerate(EDGE_TYPES):
                    sel = np.nonzero(et == k)[0]
                    s0, ns = lay.offsets[s]
                    d0, nd = lay.offsets[d]
                    src, dst = ei[0, sel] - s0, ei[1, sel] - d0
                    bs = np.concatenate([src + b * ns for b in range(B)])
                    bd = np.concatenate([dst + b * nd for b in range(B)])
                    eidx = np.concatenate([sel + b * ei.shape[1] for b in range(B)])
                    out[(s, r, d)] = (torch.as_tensor(np.stack([bs, bd])), torch.as_tensor(eidx))
                    if s != d:
                        out[(d, "rev_" + r, s)] = (torch.as_tensor(np.stack([bd, bs])), torch.as_tensor(eidx))
                    else:  # region-region links are already both ways
                        pass
                self._cache[key] = out
            return self._cache[key]

        def encode(self, x, ea, lay: GraphLayout):
            B = x.shape[0]
            xd = {}
            for t in NODE_TYPES:
                o, n = lay.offsets[t]
                if n:
                    xd[t] = torch.tanh(self.inp[t](x[:, o:o + n].reshape(B * n, F_NODE)))
            edges = self._edges(lay, B)
            eaf = ea.reshape(-1, F_EDGE)
            ei = {rel: edges[rel][0] for rel in self.rels if rel in edges and rel[0] in xd and rel[2] in xd}
            eattr = {rel: eaf[edges[rel][1]] for rel in ei}
            for conv in self.convs:
                out = conv(xd, ei, edge_attr_dict=eattr)
                xd = {t: torch.tanh(out[t]) + xd[t] if t in out else xd[t] for t in xd}
            return xd

        def forward(self, x, ea, lay: GraphLayout | None = None):
            lay = lay or layout
            B = x.shape[0]
            xd = self.encode(x, ea, lay)
            g = torch.cat([v.reshape(B, -1, v.shape[-1]).mean(1, keepdim=True) for v in xd.values()], 1).mean(1)
            out = {}
            for a in AGENTS:
                t = "pool" if a == "gpu" else "class"
                n = lay.offsets[t][1]
                h = xd[t].reshape(B, n, -1)
                h = torch.cat([h, g.unsqueeze(1).expand(B, n, g.shape[-1])], -1)
                out[a] = self.heads[a](h)
            return out

    class Nets(nn.Module):
        def __init__(self):
            super().__init__()
            self.kind = kind
            if kind == "graph":
                self.actor = GraphActor()
                self.critic = Critic(state_dim)
            elif kind == "flat":
                self.actor = FlatActor(list(AGENTS))
                self.critic = Critic(state_dim)
            else:  # independent learners: own actor and own critic on its observation, per agent
                self.actors = nn.ModuleDict({a: FlatActor([a]) for a in AGENTS})
                self.critics = nn.ModuleDict({a: Critic(N * F_NODE) for a in AGENTS})

        def logits(self, x, ea):
            if self.kind == "ippo":
                out = {}
                for a in AGENTS:
                    out.update(self.actors[a](x, ea))
                return out
            return self.actor(x, ea)

        def values(self, x, s):
            """(B, agents) values: the centralized one repeated, or one per independent learner."""
            if self.kind == "ippo":
                flat = x.reshape(x.shape[0], -1)
                return torch.stack([self.critics[a](flat) for a in AGENTS], -1)
            v = self.critic(s)
            return v.unsqueeze(-1).expand(-1, len(AGENTS))

    return Nets()


def _dist_stats(logits: dict, actions=None, generator=None, masks=None):
    """Sample (or score) per agent: returns actions {a: (B, factors)}, logprob (B, agents), entropy (B, agents).
    ``masks`` {a: (B, factors, choices) bool}: choices not allowed get probability 0."""
    torch = _torch()
    acts, lps, ents = {}, [], []
    for a in AGENTS:
        lg = logits[a]
        if masks is not None:
            lg = lg.masked_fill(~masks[a], -1e9)
        logp = torch.log_softmax(lg, -1)
        if actions is None:
            if generator is None:
                act = lg.argmax(-1)
            else:
                p = logp.exp().reshape(-1, lg.shape[-1])
                act = torch.multinomial(p, 1, generator=generator).reshape(lg.shape[:-1])
        else:
            act = actions[a]
        acts[a] = act
        lps.append(logp.gather(-1, act.unsqueeze(-1)).squeeze(-1).sum(-1))
        ents.append(-(logp.exp() * logp.clamp(min=-30.0)).sum(-1).sum(-1))
    return acts, torch.stack(lps, -1), torch.stack(ents, -1)


HANDOVERS = ("rule", "placement", "restore", "placement+restore")  # what the SLO fallback hands over
HANDOVER = "placement"  # TrainedPolicy's default, chosen on the validation segments (docs/graph-marl.md)


class TrainedPolicy:
    """Joint actions of trained networks, usable as ``evaluate(cfg, policy, ...)``'s callable.

    ``deterministic=True`` (default: how a checkpoint is validated, gated and deployed) takes each factor's most
    likely correction among the allowed ones (masks): where the policy learned nothing, that is the rule's own
    decision. ``deterministic=False`` samples the stochastic policy, as it acted in training, from a generator
    reseeded at each episode start (``reset(seed)``; ``evaluate`` does it), so the same seed gives the same
    actions.

    ``fallback`` (a ``recipe.RuleFallback``, or None): once the SLO attainment of all requests that ended in the
    episode so far falls below the target, every later epoch is handed to the rule, as ``handover`` says:
    ``"placement"`` (default) the rule's scaling and routing with every class kept on the cloud and model variant
    it is served by (``env.handover_action(placement=True)``: the rule moves no class onto pools the policy
    switched off); ``"rule"`` the rule's whole decision (no correction); ``"restore"`` and ``"placement+restore"``
    also add a replica to every pool with none on. Chosen on the validation segments (docs/graph-marl.md, "The
    run-time monitor").
    ``guard`` (a ``recipe.InputGuard``, or None): an epoch after one whose share of long requests was above the
    training data's highest, or unknown (the first), takes the rule's decision. :func:`monitored` sets both.
    ``rule_start``: the first epochs of an episode that take the rule's decision (``MAPPOArgs.rule_start_epochs``,
    as the policy was trained)."""

    def __init__(self, nets, deterministic: bool = True, fallback=None, rule_start: int = 0, guard=None,
                 handover: str = HANDOVER):
        self.nets = nets
        self.deterministic = deterministic
        self.fallback = fallback
        self.guard = guard
        self.handover = handover
        self.rule_start = int(rule_start)
        self.gen = None

    @property
    def handover(self) -> str:
        return self._handover

    @handover.setter
    def handover(self, value: str) -> None:
        if value not in HANDOVERS:
            raise ValueError(f"handover {value!r}: expected one of {', '.join(HANDOVERS)}")
        self._handover = value

    def reset(self, seed: int) -> None:
        self.gen = _torch().Generator().manual_seed(int(seed))
        for m in (self.fallback, self.guard):
            if m is not None:
                m.reset()

    def __call__(self, env, obs, state):
        tripped = self.fallback is not None and self.fallback.step(env.mc.cls_ok, env.mc.cls_ended)
        guarded = self.guard is not None and self.guard.step(env.mc.long_share)  # (both count every decision)
        if tripped and self.handover != "rule":
            return env.handover_action(placement="placement" in self.handover, restore="restore" in self.handover)
        if tripped or guarded:
            return env.rule_action()
        if env.mc.epoch < self.rule_start:
            return env.rule_action()
        torch = _torch()
        o = next(iter(obs.values()))
        if self.gen is None:
            self.reset(0)
        with torch.no_grad():
            x = torch.as_tensor(o["x"]).unsqueeze(0)
            ea = torch.as_tensor(o["edge_attr"]).unsqueeze(0)
            acts, _, _ = _dist_stats(self.nets.logits(x, ea), generator=None if self.deterministic else self.gen,
                                     masks=_masks(env))
        return {a: acts[a][0].numpy() for a in AGENTS}


def _masks(env, batch: bool = True):
    torch = _torch()
    m = env.action_masks()
    return {a: torch.as_tensor(m[a]).unsqueeze(0) if batch else torch.as_tensor(m[a]) for a in AGENTS}


def _plain(x):
    """Tensors, and Python scalars / strings / None in dicts, lists and tuples: what ``torch.load(weights_only=True)``
    reads back without unpickling objects (numpy scalars and arrays become Python numbers and lists)."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    return x


def save_checkpoint(path: str | Path, payload: dict) -> None:
    """Atomic: write a temporary file beside ``path``, then ``os.replace`` it into place. Only tensors and plain
    Python values are written, so :func:`load_checkpoint` reads it with ``weights_only=True``."""
    torch = _torch()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(_plain(payload), tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | Path) -> dict:
    """A checkpoint written by :func:`save_checkpoint`, read with ``torch.load(weights_only=True)``: tensors and
    plain values only, nothing unpickled (docs/security.md); anything else is one-line ``InputError``."""
    import zipfile

    from fleetwise.control.checkpoint import MAX_FILE_BYTES, MAX_UNCOMPRESSED_BYTES, CheckpointError, open_regular

    torch = _torch()
    try:
        # a regular file under the checkpoints' size bound, a zip whose declared contents are bounded too (a FIFO
        # hung; a 1 MB file declared a 1 GiB tensor, 1.26 GB of memory), then torch's weights-only reader
        with open_regular(Path(path), MAX_FILE_BYTES, "checkpoint") as f:
            with zipfile.ZipFile(f) as zf:
                infos = zf.infolist()
                total = sum(i.file_size for i in infos)
            if len(infos) > 10_000 or total > MAX_UNCOMPRESSED_BYTES:
                raise InputError(f"{path}: not a fleetwise graph-marl checkpoint ({len(infos)} members, {total:,} "
                                 f"bytes uncompressed: more than the limit of {MAX_UNCOMPRESSED_BYTES:,})")
            f.seek(0)
            ck = torch.load(f, weights_only=True, map_location="cpu")
    except InputError:
        raise
    except (CheckpointError, zipfile.BadZipFile, OSError) as e:
        raise InputError(f"{path}: not a fleetwise graph-marl checkpoint ({str(e).splitlines()[0][:200]})") from None
    except Exception as e:  # noqa: BLE001 - torch raises several types; the first line says what was refused
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"{path}: not a fleetwise graph-marl checkpoint ({first[:200]})") from None
    if not isinstance(ck, dict) or not {"nets", "args", "update"} <= set(ck):
        raise InputError(f"{path}: not a fleetwise graph-marl checkpoint (missing nets/args/update)")
    return ck


def check_tail_args(quantile, scale=1.0) -> None:
    """The tail constraint's arguments (``MAPPOArgs.tail_quantile``, ``tail_scale``), or one InputError line."""
    if quantile is not None and (isinstance(quantile, bool) or not isinstance(quantile, (int, float))
                                 or not 0 < quantile < 1):
        raise InputError(f"tail_quantile={quantile!r}: expected a number in (0, 1), e.g. 0.99, or None")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (math.isfinite(scale) and scale > 0):
        raise InputError(f"tail_scale={scale!r}: expected a finite number > 0")


def tail_targets(ttft: list, quantile: float, scale: float = 1.0) -> list[float]:
    """The tail constraint's target TTFT per class: the empirical ``quantile`` of the rule's TTFTs (``ttft``: a list
    per class; a dropped request's is inf; not interpolated, so at least that share of the rule's requests is within
    it) x ``scale``; a class with no finite one gets inf (no constraint)."""
    out = []
    for t in ttft:
        t = np.asarray(t, dtype=np.float64)
        q = float(np.quantile(t, quantile, method="inverted_cdf")) if len(t) else math.inf
        out.append(q * scale if math.isfinite(q) else math.inf)
    return out


def _rule_rollouts(env, episodes: int, seed0: int, ttft: list | None = None):
    """Observations and masks of ``episodes`` episodes in which every agent takes the rule's action (zero
    correction), and the per-class (within SLO, ended) request counts; the ended requests' TTFTs are appended to
    ``ttft`` (a list per class) when given."""
    X, EA, M = [], [], {a: [] for a in AGENTS}
    ok = n = 0
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed0 + ep)
        while env.agents:
            o = obs[AGENTS[0]]
            X.append(o["x"])
            EA.append(o["edge_attr"])
            m = env.action_masks()
            for a in AGENTS:
                M[a].append(m[a])
            obs, _, _, _, info = env.step(env.rule_action())
            inf = next(iter(info.values()))
            ok, n = ok + inf["class_ok"], n + inf["class_ended"]
            if ttft is not None:
                for k, t in enumerate(inf["class_ttft"]):
                    ttft[k].extend(t.tolist())
    return np.stack(X), np.stack(EA), {a: np.stack(M[a]) for a in AGENTS}, np.asarray(ok), np.asarray(n)


def behaviour_clone_rule(nets, opt, X, EA, M, target: float, max_steps: int) -> list[float]:
    """Warm start at the rule (recipe step 2): maximum likelihood of the zero correction on the rule's own
    states, until its mean probability per decision reaches ``target`` (kept below 1 so PPO still explores).
    Returns the mean probability after each step."""
    torch = _torch()
    x, ea = torch.as_tensor(X), torch.as_tensor(EA)
    masks = {a: torch.as_tensor(M[a]) for a in AGENTS}
    zeros = {a: torch.zeros(M[a].shape[:2], dtype=torch.long) for a in AGENTS}
    hist = []
    for _ in range(max_steps):
        lg = nets.logits(x, ea)
        p0 = torch.stack([torch.softmax(lg[a].masked_fill(~masks[a], -1e9), -1)[..., 0].mean() for a in AGENTS]).mean()
        hist.append(float(p0.detach()))
        if hist[-1] >= target:
            break
        _, lp, _ = _dist_stats(lg, zeros, masks=masks)
        loss = -lp.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return hist


class _Holder:  # what recipe.Validator expects: ``.policy`` with state_dict / load_state_dict
    def __init__(self, nets):
        self.policy = nets


def best_rule(rule_rows: dict, slo_target: float) -> str:
    """The cheapest rule (mean cost) among those whose mean SLO attainment reaches ``slo_target``; if none does,
    the one with the highest attainment."""
    mean = {h: (float(np.mean([r["cost_usd"] for r in rows])), float(np.mean([r["slo_attainment"] for r in rows])))
            for h, rows in rule_rows.items()}
    meeting = [h for h in mean if mean[h][1] >= slo_target]
    return min(meeting, key=lambda h: mean[h][0]) if meeting else max(mean, key=lambda h: mean[h][1])


class ValidationWindows:
    """Validation segments (the ``validation`` split of every trace, never trained on or reported) with every
    rule's results computed once. ``policy_result(policy)`` evaluates a policy on them against the best rule
    (:func:`best_rule`): score (higher is better: minus the mean paired cost change, minus penalties when P99
    exceeds the rule's by more than ``p99_margin`` or SLO attainment falls below the target), and the gate
    (``recipe.gate`` on cost, the constraint being P99 and SLO attainment)."""

    def __init__(self, cfg, seeds, duration_s: float, p99_margin: float = 0.10, p99_per_segment: bool = True):
        from fleetwise.envs.graph_marl import HEURISTICS, evaluate

        self.cfg, self.seeds, self.duration_s, self.p99_margin = cfg, list(seeds), duration_s, p99_margin
        self.p99_per_segment = p99_per_segment
        self.rules = {h: evaluate(cfg, h, self.seeds, split="validation", duration_s=duration_s) for h in HEURISTICS}
        self.best_rule = best_rule(self.rules, cfg.slo_target)

    def policy_result(self, policy) -> dict:
        from fleetwise.envs.graph_marl import evaluate
        from fleetwise.learn.recipe import gate

        rows = evaluate(self.cfg, policy, self.seeds, split="validation", duration_s=self.duration_s)
        ref = {r["seed"]: r for r in self.rules[self.best_rule]}
        cost = {r["seed"]: r["cost_usd"] for r in rows}
        cost_ref = {s: ref[s]["cost_usd"] for s in ref}
        p99, p99_ref = (float(np.mean([r["latency_p99_s"] for r in rr])) for rr in (rows, ref.values()))
        att = float(np.mean([r["slo_attainment"] for r in rows]))
        cost_ch = float(np.mean([cost[s] / cost_ref[s] - 1.0 for s in cost]))
        if self.p99_per_segment:  # the mean excess per segment: one segment's blown tail is not averaged away
            p99_excess = float(np.mean([max(0.0, r["latency_p99_s"] / ref[r["seed"]]["latency_p99_s"] - 1.0
                                            - self.p99_margin) for r in rows]))
        else:
            p99_excess = max(0.0, p99 / p99_ref - 1.0 - self.p99_margin)
        att_short = max(0.0, self.cfg.slo_target - att)
        ok = p99_excess == 0.0 and att_short == 0.0
        score = -cost_ch - 2.0 * p99_excess - 10.0 * att_short
        g = gate(cost, cost_ref, lower_is_better=True, constraint_ok=ok)
        return {"score": score, "rule": self.best_rule, "cost_change": cost_ch, "p99_s": p99, "rule_p99_s": p99_ref,
                "slo_attainment": att, "slo_target": self.cfg.slo_target, "p99_margin": self.p99_margin,
                "windows": len(rows), "split": "validation", "gate": g}


def train(make_env: Callable[[], object], args: MAPPOArgs, ckpt_path: str | Path | None = None,
          resume: bool = False, progress: Callable[[int], None] | None = None, stop_after: int | None = None,
          validation: ValidationWindows | None = None):
    """Train ``args.kind`` with (MA/I)PPO on the shared recipe (``fleetwise.learn.recipe``): actions correct the
    rule (the environment composes them), masked; warm start by behaviour cloning of the zero correction; per-class
    SLO attainment as a constraint (one ``recipe.Lagrangian`` per class, the multipliers in ``info["lagrange"]``);
    with ``validation``, checkpoint choice and early stopping on validation segments (``recipe.Validator``) and
    the gate against the best rule (``info["validation"]``, also in the model card beside ``ckpt_path``).

    Returns (TrainedPolicy, curve [(env steps, mean episode return)], info {"update", "wall_s", "env_steps",
    "lagrange", "validation", "bc"}). ``stop_after`` stops after that many updates of this call (to simulate a kill
    in tests)."""
    from fleetwise.learn.recipe import Lagrangian, Validator

    torch = _torch()
    env = make_env()
    if not 0 <= args.rule_start_epochs < env.n_epochs:
        raise InputError(f"rule_start_epochs {args.rule_start_epochs}: expected 0 to {env.n_epochs - 1} (the "
                         "episode's epochs)")
    check_tail_args(args.tail_quantile, args.tail_scale)
    sizes = _sizes(env)
    nets = build_networks(args.kind, env.layout, sizes, env.state_dim, args.hidden, args.gnn_layers)
    opt = torch.optim.Adam(nets.parameters(), lr=args.learning_rate, eps=1e-5)
    gen = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    cfg = env.cfg
    nc = len(cfg.classes)
    expected = np.array([c.rate_rps * cfg.epoch_s for c in cfg.classes])
    update, curve, env_steps, stopped, bc_hist = 0, [], 0, False, []
    rollbacks: list = []  # env steps at which training restarted from the best parameters (rollback_checks)
    kls: list = []  # per update: (the largest agent's approximate KL at its last check, gradient steps taken)
    lags: list = []
    tails: list = []  # the tail constraint's target TTFT per class (s; MAPPOArgs.tail_quantile)
    val_state: dict = {}
    validator = None
    last_val: dict = {}
    if validation is not None:
        def _score(m) -> float:
            last_val["d"] = validation.policy_result(TrainedPolicy(m.policy, rule_start=args.rule_start_epochs))
            return last_val["d"]["score"]

        validator = Validator(score=_score, patience=args.patience)
    val_detail: dict = {}
    if resume and ckpt_path is not None and Path(ckpt_path).exists():
        ck = load_checkpoint(ckpt_path)
        if ck["args"]["kind"] != args.kind:
            raise InputError(f"{ckpt_path}: checkpoint of kind {ck['args']['kind']!r}, expected {args.kind!r}")
        if "lagrange" not in ck:
            raise InputError(f"{ckpt_path}: a checkpoint from before the shared recipe; delete it to retrain")
        nets.load_state_dict(ck["nets"])
        opt.load_state_dict(ck["opt"])
        gen.set_state(ck["gen"])
        update, curve, env_steps = ck["update"], ck["curve"], ck["env_steps"]
        stopped, bc_hist, val_detail = ck["stopped"], ck["bc"], ck["val_detail"]
        kls = [tuple(k) for k in ck.get("kl", [])]
        rollbacks = list(ck.get("rollbacks", []))
        lags = [Lagrangian(**{k.lstrip("_"): v for k, v in d.items()}) for d in ck["lagrange"]]
        tails = list(ck.get("tail_targets", []))
        if len(lags) != nc * (1 + (args.tail_quantile is not None)):
            raise InputError(f"{ckpt_path}: a checkpoint with {len(lags)} constraints, expected "
                             f"{nc * (1 + (args.tail_quantile is not None))} (tail_quantile differs); delete it")
        old = {"_best_state": "best_state", "_bad": "bad_checks"}  # checkpoints written before the rename
        val_state = {old.get(k, k): v for k, v in (ck["validator"] or {}).items()}
        if validator is not None and val_state:
            for k, v in val_state.items():
                setattr(validator, k, v)
            stopped = validator.bad_checks >= validator.patience  # under this run's patience
    else:
        # identical initial weights for every kind's seed, independent of construction order elsewhere
        g0 = torch.Generator().manual_seed(args.seed + 17)
        with torch.no_grad():
            for p in nets.parameters():
                if p.dim() > 1:
                    p.copy_(torch.nn.init.orthogonal_(torch.empty_like(p), gain=1.0, generator=g0))
                else:
                    p.zero_()
            # prior: action 0 (the rule's decision) is the likely action at the start (all agents, all kinds)
            for name, p in nets.named_parameters():
                for a in AGENTS:
                    if name.endswith(f"{a}.bias"):
                        p.view(-1, sizes[a][1])[:, 0] = args.hold_bias
        # warm start at the rule, and the constraint's targets from the rule's own attainment
        rule_ttft: list = [[] for _ in range(nc)]
        X, EA, M, ok, n = _rule_rollouts(env, max(args.bc_episodes, 1), args.seed * 1_000_003 + 999_999, rule_ttft)
        if args.bc_episodes > 0:
            bc_hist = behaviour_clone_rule(nets, opt, X, EA, M, args.bc_target, args.bc_max_steps)
        att = ok / np.maximum(n, 1)
        lags = [Lagrangian(target=float(args.slo_target if args.slo_target is not None else max(att[k] - 0.01, 0.0)),
                           sense=">=", lr=args.lagrange_lr, lam_max=args.lagrange_max) for k in range(nc)]
        if args.tail_quantile is not None:
            tails = tail_targets(rule_ttft, args.tail_quantile, args.tail_scale)
            lags += [Lagrangian(target=float(args.tail_quantile), sense=">=", lr=args.lagrange_lr,
                                lam_max=args.lagrange_max, scale=1.0) for _ in range(nc)]
        if validator is not None:  # the warm start is the first candidate checkpoint
            validator.check(_Holder(nets), 0)
            val_detail = last_val["d"]
    nA = len(AGENTS)
    t0 = time.perf_counter()
    done_here = 0
    while update < args.updates and not stopped:
        X, EA, S, ACT, LP, V, R, DONE = [], [], [], {a: [] for a in AGENTS}, [], [], [], []
        MK = {a: [] for a in AGENTS}
        ep_returns = []
        c_ok, c_n, c_tail = np.zeros(nc), np.zeros(nc), np.zeros(nc)
        for ep in range(args.episodes_per_update):
            obs, _ = env.reset(seed=args.seed * 1_000_003 + update * args.episodes_per_update + ep)
            ret = 0.0
            while env.agents and env.mc.epoch < args.rule_start_epochs:  # the rule's epochs: not the policy's
                obs, rew, _, _, _ = env.step(env.rule_action())
                ret += float(rew[AGENTS[0]])
            while env.agents:
                o = obs[AGENTS[0]]
                x = torch.as_tensor(o["x"]).unsqueeze(0)
                ea = torch.as_tensor(o["edge_attr"]).unsqueeze(0)
                s = torch.as_tensor(env.state()).unsqueeze(0)
                mk = _masks(env)
                with torch.no_grad():
                    acts, lp, _ = _dist_stats(nets.logits(x, ea), generator=gen, masks=mk)
                    v = nets.values(x, s)
                obs, rew, _, trunc, info = env.step({a: acts[a][0].numpy() for a in AGENTS})
                inf = next(iter(info.values()))
                r = float(rew[AGENTS[0]])
                ret += r
                # the constraint: each class's SLO attainment this epoch below its target costs lambda x shortfall,
                # weighted by the class's share of its expected requests
                k_ok, k_n = inf["class_ok"], inf["class_ended"]
                c_ok += k_ok
                c_n += k_n
                pen = sum(lags[k].penalty(k_ok[k] / k_n[k]) * k_n[k] / expected[k] for k in range(nc) if k_n[k] > 0)
                for k, t in enumerate(inf["class_ttft"] if tails else ()):  # the tail: share within the target
                    if len(t):
                        within = int(np.count_nonzero(t <= tails[k]))
                        c_tail[k] += within
                        pen += lags[nc + k].penalty(within / len(t)) * len(t) / expected[k]
                X.append(x[0]); EA.append(ea[0]); S.append(s[0]); LP.append(lp[0]); V.append(v[0])
                R.append(r - pen)
                DONE.append(not env.agents)
                for a in AGENTS:
                    ACT[a].append(acts[a][0])
                    MK[a].append(mk[a][0])
                env_steps += 1
            ep_returns.append(ret)
        for k in range(nc):  # dual ascent on the rollout's attainment per class (and its tail)
            lags[k].update(float(c_ok[k] / max(c_n[k], 1)), env_steps)
            if tails:
                lags[nc + k].update(float(c_tail[k] / max(c_n[k], 1)), env_steps)
        T = len(R)
        X, EA, S = torch.stack(X), torch.stack(EA), torch.stack(S)
        LP, V = torch.stack(LP), torch.stack(V)
        ACT = {a: torch.stack(ACT[a]) for a in AGENTS}
        MK = {a: torch.stack(MK[a]) for a in AGENTS}
        Rt = torch.tensor(R, dtype=torch.float32).unsqueeze(-1).expand(T, nA)
        adv = torch.zeros(T, nA)
        last = torch.zeros(nA)
        for t in reversed(range(T)):  # episodes end by truncation at the horizon's drain: bootstrap 0
            nonterm = 0.0 if DONE[t] else 1.0
            nv = V[t + 1] if (t + 1 < T and not DONE[t]) else torch.zeros(nA)
            delta = Rt[t] + args.gamma * nv * nonterm - V[t]
            last = delta + args.gamma * args.gae_lambda * nonterm * last
            adv[t] = last
        ret_t = adv + V
        kl_max, steps, kl_stop = 0.0, 0, False
        for _ in range(args.n_epochs):
            perm = torch.randperm(T, generator=gen)
            for i in range(0, T, args.minibatch_size):
                mb = perm[i:i + args.minibatch_size]
                _, newlp, ent = _dist_stats(nets.logits(X[mb], EA[mb]), {a: ACT[a][mb] for a in AGENTS},
                                            masks={a: MK[a][mb] for a in AGENTS})
                a_mb = adv[mb]
                a_mb = (a_mb - a_mb.mean(0)) / (a_mb.std(0) + 1e-8)
                logratio = newlp - LP[mb]
                ratio = logratio.exp()
                with torch.no_grad():  # per agent (its factors' joint log-probability), as SB3 estimates it
                    kl_max = float(((ratio - 1.0) - logratio).mean(0).max())
                if args.target_kl is not None and kl_max > 1.5 * args.target_kl:
                    kl_stop = True  # before this step, as SB3 does: the policy stays within reach of the rollout's
                    break
                pg = torch.max(-a_mb * ratio, -a_mb * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
                vloss = 0.5 * ((nets.values(X[mb], S[mb]) - ret_t[mb]) ** 2).mean()
                loss = pg * nA + args.vf_coef * vloss - args.ent_coef * ent.mean() * nA
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(nets.parameters(), args.max_grad_norm)
                opt.step()
                steps += 1
            if kl_stop:
                break
        kls.append((kl_max, steps))
        update += 1
        done_here += 1
        curve.append((env_steps, float(np.mean(ep_returns))))
        if validator is not None and args.val_every and (update % args.val_every == 0 or update == args.updates):
            keep_going = validator.check(_Holder(nets), env_steps)
            if validator.best_step == env_steps:
                val_detail = last_val["d"]
            stopped = not keep_going
            if args.rollback_checks and not stopped:
                since = [v for st, v in validator.curve[1:] if st > (rollbacks[-1] if rollbacks else 0)]
                if (len(since) >= args.rollback_checks
                        and max(since[-args.rollback_checks:]) < validator.curve[0][1]):
                    validator.restore(_Holder(nets))
                    opt = torch.optim.Adam(nets.parameters(), lr=args.learning_rate, eps=1e-5)
                    for g in lags:
                        g.lam, g.integral = 0.0, 0.0
                    rollbacks.append(env_steps)
        if progress is not None:
            progress(update)
        if ckpt_path is not None and (update % args.ckpt_every == 0 or update == args.updates or stopped):
            _save(ckpt_path, nets, opt, gen, update, curve, env_steps, args, lags, validator, stopped, bc_hist,
                  val_detail, kls, rollbacks, tails)
        if stop_after is not None and done_here >= stop_after:
            break
    if validator is not None and (stopped or update >= args.updates):
        validator.restore(_Holder(nets))
    nets.eval()
    info = {"update": update, "wall_s": time.perf_counter() - t0, "env_steps": env_steps, "bc": bc_hist, "kl": kls,
            "rollbacks": rollbacks,
            "lagrange": [{"target": g.target, "lam": g.lam, "history": g.history} for g in lags],
            "tail_targets": tails,
            "validation": val_detail or None,
            "validation_curve": list(validator.curve) if validator is not None else [],
            "best_step": validator.best_step if validator is not None else None, "early_stopped": stopped}
    if ckpt_path is not None and validator is not None:
        write_card(ckpt_path, args, info, cfg)
    return TrainedPolicy(nets, rule_start=args.rule_start_epochs), curve, info


def train_job(job: dict) -> dict:
    """One training job (``recipe.run_jobs``: a worker process or a Ray task): ``job`` holds ``cfg``, ``args``
    (a ``MAPPOArgs`` as a dict), ``ckpt`` (path), ``validation`` (a :class:`ValidationWindows` or None). Trains
    (resuming from the checkpoint) and returns what pickles: curve, info and the checkpoint's path; the chosen
    networks are read back with :func:`load_trained`."""
    from fleetwise.envs.graph_marl import make_env

    args = MAPPOArgs(**job["args"])
    cfg = job["cfg"]
    _, curve, info = train(lambda: make_env(cfg, duration_s=args.train_segment_s), args, ckpt_path=job["ckpt"],
                           resume=True, validation=job.get("validation"))
    return {"name": job.get("name"), "curve": curve, "info": info, "ckpt": str(job["ckpt"])}


def load_trained(ckpt_path: str | Path, cfg) -> TrainedPolicy:
    """The policy a checkpoint chose: the validation's best parameters when it has them, else the last ones.
    (Read with ``torch.load(weights_only=True)``: tensors and plain values, nothing unpickled.)"""
    from fleetwise.envs.graph_marl import make_env

    ck = load_checkpoint(ckpt_path)
    a = ck["args"]
    env = make_env(cfg, duration_s=a["train_segment_s"])
    nets = build_networks(a["kind"], env.layout, _sizes(env), env.state_dim, a["hidden"], a["gnn_layers"])
    v = ck.get("validator") or {}
    best = v.get("best_state", v.get("_best_state"))
    nets.load_state_dict(best if best is not None else ck["nets"])
    nets.eval()
    return TrainedPolicy(nets, rule_start=a.get("rule_start_epochs", 0))


def training_episode_seeds(args: MAPPOArgs, updates: int) -> list[int]:
    """The seeds of every training segment a run of ``args`` drew in ``updates`` updates: the rule's episodes of
    the warm start, then ``episodes_per_update`` per update (as :func:`train` reseeds the environment)."""
    base = args.seed * 1_000_003
    return [base + 999_999 + ep for ep in range(max(args.bc_episodes, 1))] + \
        [base + u * args.episodes_per_update + ep for u in range(updates) for ep in range(args.episodes_per_update)]


def training_long_share_max(cfg, args: MAPPOArgs, updates: int) -> float:
    """The input guard's threshold (``recipe.InputGuard``): the highest share of long requests that any epoch of
    the training segments had (``worlds.multicloud.epoch_long_share``), recomputed from the segments' seeds
    (their arrivals do not depend on the policy; about 10 ms per segment)."""
    from fleetwise.worlds.multicloud import epoch_long_share, multicloud_workload

    best = 0.0
    for seed in training_episode_seeds(args, updates):
        w = multicloud_workload(cfg, np.random.default_rng(seed), False, args.train_segment_s)
        sh = epoch_long_share(w, cfg.epoch_s)
        if np.isfinite(sh).any():
            best = max(best, float(np.nanmax(sh)))
    return best


def checkpoint_long_share_max(ckpt_path: str | Path, cfg) -> float:
    """A checkpoint's input-guard threshold: its model card's ``training.long_share_max``, or, for a card written
    before the field existed, recomputed from the checkpoint's arguments and updates."""
    import json

    try:
        v = (json.loads(card_file(ckpt_path).read_text()).get("training") or {}).get("long_share_max")
    except (OSError, ValueError, AttributeError):
        v = None
    if isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v <= 1.0:
        return float(v)
    ck = load_checkpoint(ckpt_path)
    return training_long_share_max(cfg, MAPPOArgs(**ck["args"]), int(ck["update"]))


def monitored(policy: TrainedPolicy, ckpt_path: str | Path, cfg, handover: str | None = None) -> TrainedPolicy:
    """``policy`` behind the run-time monitor: the rule decides once the SLO attainment of the episode so far is
    below the target (``recipe.RuleFallback``, for good; ``handover``, if given, sets what it hands over:
    :class:`TrainedPolicy`) and while the traffic is unlike the training data's (``recipe.InputGuard``, the
    checkpoint's threshold)."""
    from fleetwise.learn.recipe import InputGuard, RuleFallback

    if handover is not None:
        policy.handover = handover  # (checked by TrainedPolicy)
    policy.fallback = RuleFallback(cfg.slo_target)
    policy.guard = InputGuard(checkpoint_long_share_max(ckpt_path, cfg))
    return policy


def _save(path, nets, opt, gen, update, curve, env_steps, args, lags, validator, stopped, bc_hist, val_detail,
          kls, rollbacks, tails=()):
    vs = {}
    if validator is not None:
        vs = {k: getattr(validator, k) for k in ("best", "best_step", "curve", "best_state", "bad_checks")}
    save_checkpoint(path, {"nets": nets.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                           "update": update, "curve": curve, "env_steps": env_steps, "args": asdict(args),
                           "lagrange": [{"target": g.target, "sense": g.sense, "lr": g.lr, "ki": g.ki, "lam": g.lam,
                                         "lam_max": g.lam_max, "scale": g.scale, "hinge": g.hinge,
                                         "history": list(g.history), "integral": g.integral} for g in lags],
                           "validator": vs, "stopped": stopped, "bc": bc_hist, "val_detail": val_detail,
                           "kl": [list(k) for k in kls], "rollbacks": list(rollbacks), "tail_targets": list(tails)})


def card_file(ckpt_path: str | Path) -> Path:
    """``dir/NAME.pt`` -> ``dir/NAME.card.json``."""
    p = Path(ckpt_path)
    return p.with_name(p.stem + ".card.json")


def write_card(ckpt_path, args: MAPPOArgs, info: dict, cfg) -> Path:
    """The model card beside the checkpoint (``control.checkpoint.ModelCard``): training data and budget, and
    ``validation``: the chosen checkpoint against the best rule on validation segments, with the gate."""
    import json

    from fleetwise.control.checkpoint import ModelCard
    from fleetwise.worlds.multicloud_rules import RULE

    card = ModelCard(level="allocator", policy=f"graph-marl/{args.kind}", rule=RULE, training={
        "data": "multicloud segments: first train_fraction - validation_fraction of each trace (azure-conv, "
                "azure-code, servegen m-large)", "train_segment_s": args.train_segment_s, "updates": info["update"],
        "episodes_per_update": args.episodes_per_update, "env_steps": info["env_steps"], "seed": args.seed,
        "best_step": info["best_step"], "early_stopped": info["early_stopped"],
        # the run-time monitor's input guard (recipe.InputGuard): the training segments' highest long-request share
        "long_share_max": training_long_share_max(cfg, args, info["update"]),
        "lagrange": [{"target": g["target"], "lam": g["lam"]} for g in info["lagrange"]]},
        validation=info["validation"])
    out = card_file(ckpt_path)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(card.to_json(), indent=1))
    os.replace(tmp, out)
    return out


def inference_time_vs_nodes(node_counts=(100, 1000, 10000), repeats: int = 5, hidden: int = 32) -> list[dict]:
    """Seconds per forward pass (one joint action of all agents) of the graph actor on synthetic fleets of about
    ``n`` nodes: R regions in 3 clouds, 3 pools per region, 4 instances per pool, 3 request classes, each region
    linked to its 4 ring neighbours (a full mesh has R^2 links)."""
    torch = _torch()
    from fleetwise.envs.graph_marl import graph_layout

    out = []
    for n in node_counts:
        R = max(1, (n - 6) // 16)
        pool_region = [r for r in range(R) for _ in range(3)]
        inst_pool = [p for p in range(len(pool_region)) for _ in range(4)]
        lay = graph_layout(3, R, [r % 3 for r in range(R)], pool_region, inst_pool, 3, region_degree=4)
        sizes = {"cloud": (3, 4), "model": (3, 2), "gpu": (len(pool_region), 4), "router": (3, 3)}
        nets = build_networks("graph", lay, sizes, 8, hidden)
        rng = np.random.default_rng(0)
        x = torch.as_tensor(rng.random((1, lay.num_nodes, F_NODE), dtype=np.float32))
        ea = torch.as_tensor(rng.random((1, lay.edge_index.shape[1], F_EDGE), dtype=np.float32))
        with torch.no_grad():
            _dist_stats(nets.logits(x, ea))  # warm-up (and edge cache)
            ts = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                _dist_stats(nets.logits(x, ea))
                ts.append(time.perf_counter() - t0)
        out.append({"nodes": lay.num_nodes, "edges": int(lay.edge_index.shape[1]), "pools": len(pool_region),
                    "inference_s": float(np.median(ts))})
    return out
