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

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from fleetwise.envs.graph_marl import AGENTS, EDGE_TYPES, F_EDGE, F_NODE, NODE_TYPES, GraphLayout
from fleetwise.errors import InputError


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
    hidden: int = 32
    gnn_layers: int = 2
    ckpt_every: int = 5
    hold_bias: float = 2.0  # initial logit bias of the GPU agent's "hold" action
    seed: int = 0


def _sizes(env) -> dict:
    """Per agent: (number of factors, choices per factor)."""
    return {a: (len(env.action_space(a).nvec), int(env.action_space(a).nvec[0])) for a in AGENTS}


def _torch():
    import torch

    torch.set_num_threads(1)
    return torch


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


def _dist_stats(logits: dict, actions=None, generator=None):
    """Sample (or score) per agent: returns actions {a: (B, factors)}, logprob (B, agents), entropy (B, agents)."""
    torch = _torch()
    acts, lps, ents = {}, [], []
    for a in AGENTS:
        lg = logits[a]
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
        ents.append(-(logp.exp() * logp).sum(-1).sum(-1))
    return acts, torch.stack(lps, -1), torch.stack(ents, -1)


class TrainedPolicy:
    """Joint actions of trained networks, usable as ``evaluate(cfg, policy, ...)``'s callable.

    ``deterministic=False`` (default) samples the trained stochastic policy, as it acted in training, from a
    generator reseeded at each episode start (``reset(seed)``; ``evaluate`` does it), so the same seed gives the
    same actions. ``deterministic=True`` takes each factor's most likely choice: for the GPU agent that is
    mostly "hold", because scaling is a rare action of the trained policy."""

    def __init__(self, nets, deterministic: bool = False):
        self.nets = nets
        self.deterministic = deterministic
        self.gen = None

    def reset(self, seed: int) -> None:
        self.gen = _torch().Generator().manual_seed(int(seed))

    def __call__(self, env, obs, state):
        torch = _torch()
        o = next(iter(obs.values()))
        if self.gen is None:
            self.reset(0)
        with torch.no_grad():
            x = torch.as_tensor(o["x"]).unsqueeze(0)
            ea = torch.as_tensor(o["edge_attr"]).unsqueeze(0)
            acts, _, _ = _dist_stats(self.nets.logits(x, ea), generator=None if self.deterministic else self.gen)
        return {a: acts[a][0].numpy() for a in AGENTS}


def save_checkpoint(path: str | Path, payload: dict) -> None:
    """Atomic: write a temporary file beside ``path``, then ``os.replace`` it into place."""
    torch = _torch()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def train(make_env: Callable[[], object], args: MAPPOArgs, ckpt_path: str | Path | None = None,
          resume: bool = False, progress: Callable[[int], None] | None = None, stop_after: int | None = None):
    """Train ``args.kind`` with (MA/I)PPO for ``args.updates`` updates. Returns (TrainedPolicy, curve
    [(env steps, mean episode return)], info {"update", "wall_s", "env_steps"}). ``stop_after`` stops after that
    many updates of this call (to simulate a kill in tests)."""
    torch = _torch()
    env = make_env()
    sizes = _sizes(env)
    nets = build_networks(args.kind, env.layout, sizes, env.state_dim, args.hidden, args.gnn_layers)
    opt = torch.optim.Adam(nets.parameters(), lr=args.learning_rate, eps=1e-5)
    gen = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    update, curve, env_steps = 0, [], 0
    if resume and ckpt_path is not None and Path(ckpt_path).exists():
        ck = torch.load(ckpt_path, weights_only=False)
        if ck["args"]["kind"] != args.kind:
            raise InputError(f"{ckpt_path}: checkpoint of kind {ck['args']['kind']!r}, expected {args.kind!r}")
        nets.load_state_dict(ck["nets"])
        opt.load_state_dict(ck["opt"])
        gen.set_state(ck["gen"])
        update, curve, env_steps = ck["update"], ck["curve"], ck["env_steps"]
    else:
        # identical initial weights for every kind's seed, independent of construction order elsewhere
        g0 = torch.Generator().manual_seed(args.seed + 17)
        with torch.no_grad():
            for p in nets.parameters():
                if p.dim() > 1:
                    p.copy_(torch.nn.init.orthogonal_(torch.empty_like(p), gain=1.0, generator=g0))
                else:
                    p.zero_()
            # prior for the GPU agent: "hold" is the likely action at the start (all kinds alike)
            for name, p in nets.named_parameters():
                if name.endswith("gpu.bias"):
                    p.view(-1, sizes["gpu"][1])[:, 0] = args.hold_bias
    nA = len(AGENTS)
    t0 = time.perf_counter()
    done_here = 0
    while update < args.updates:
        X, EA, S, ACT, LP, V, R, DONE = [], [], [], {a: [] for a in AGENTS}, [], [], [], []
        ep_returns = []
        for ep in range(args.episodes_per_update):
            obs, _ = env.reset(seed=args.seed * 1_000_003 + update * args.episodes_per_update + ep)
            ret = 0.0
            while env.agents:
                o = obs[AGENTS[0]]
                x = torch.as_tensor(o["x"]).unsqueeze(0)
                ea = torch.as_tensor(o["edge_attr"]).unsqueeze(0)
                s = torch.as_tensor(env.state()).unsqueeze(0)
                with torch.no_grad():
                    acts, lp, _ = _dist_stats(nets.logits(x, ea), generator=gen)
                    v = nets.values(x, s)
                obs, rew, _, trunc, _ = env.step({a: acts[a][0].numpy() for a in AGENTS})
                r = float(rew[AGENTS[0]])
                ret += r
                X.append(x[0]); EA.append(ea[0]); S.append(s[0]); LP.append(lp[0]); V.append(v[0]); R.append(r)
                DONE.append(not env.agents)
                for a in AGENTS:
                    ACT[a].append(acts[a][0])
                env_steps += 1
            ep_returns.append(ret)
        T = len(R)
        X, EA, S = torch.stack(X), torch.stack(EA), torch.stack(S)
        LP, V = torch.stack(LP), torch.stack(V)
        ACT = {a: torch.stack(ACT[a]) for a in AGENTS}
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
        for _ in range(args.n_epochs):
            perm = torch.randperm(T, generator=gen)
            for i in range(0, T, args.minibatch_size):
                mb = perm[i:i + args.minibatch_size]
                _, newlp, ent = _dist_stats(nets.logits(X[mb], EA[mb]), {a: ACT[a][mb] for a in AGENTS})
                a_mb = adv[mb]
                a_mb = (a_mb - a_mb.mean(0)) / (a_mb.std(0) + 1e-8)
                ratio = (newlp - LP[mb]).exp()
                pg = torch.max(-a_mb * ratio, -a_mb * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
                vloss = 0.5 * ((nets.values(X[mb], S[mb]) - ret_t[mb]) ** 2).mean()
                loss = pg * nA + args.vf_coef * vloss - args.ent_coef * ent.mean() * nA
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(nets.parameters(), args.max_grad_norm)
                opt.step()
        update += 1
        done_here += 1
        curve.append((env_steps, float(np.mean(ep_returns))))
        if progress is not None:
            progress(update)
        if ckpt_path is not None and (update % args.ckpt_every == 0 or update == args.updates):
            save_checkpoint(ckpt_path, {"nets": nets.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                                        "update": update, "curve": curve, "env_steps": env_steps,
                                        "args": asdict(args)})
        if stop_after is not None and done_here >= stop_after:
            break
    nets.eval()
    return TrainedPolicy(nets), curve, {"update": update, "wall_s": time.perf_counter() - t0, "env_steps": env_steps}


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
