"""The heterogeneous resource graph of the multi-cloud world (Graph-MARL's observation, docs/graph-marl.md):
a fixed layout of cloud, region, pool, instance and request-class nodes with typed edges, and the node features
and edge attributes of the current state, as numpy arrays (the learner turns them into PyTorch Geometric
``HeteroData``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from fleetwise.worlds.multicloud import MultiCloud, region_of

NODE_TYPES = ("cloud", "region", "pool", "instance", "class")
EDGE_TYPES = (("region", "in", "cloud"), ("pool", "in", "region"), ("instance", "in", "pool"),
              ("class", "demand", "region"), ("class", "serve", "pool"), ("region", "link", "region"))
F_NODE = 15
F_EDGE = 4


@dataclass(frozen=True)
class GraphLayout:
    """Node ranges per type and the fixed edges of one configuration's graph."""

    offsets: dict  # type -> (start, count)
    edge_index: np.ndarray  # (2, E)
    edge_type: np.ndarray  # (E,)
    node_type: np.ndarray  # (N,)

    @property
    def num_nodes(self) -> int:
        return len(self.node_type)


def graph_layout(n_clouds: int, n_regions: int, region_cloud: Sequence[int], pool_region: Sequence[int],
                 inst_pool: Sequence[int], n_classes: int, region_degree: int | None = None) -> GraphLayout:
    """Fixed nodes and edges; region-region links form a full mesh, or with ``region_degree`` each region links
    to that many ring neighbours (for large synthetic fleets)."""
    counts = {"cloud": n_clouds, "region": n_regions, "pool": len(pool_region), "instance": len(inst_pool),
              "class": n_classes}
    offsets, o = {}, 0
    for t in NODE_TYPES:
        offsets[t] = (o, counts[t])
        o += counts[t]
    node_type = np.concatenate([np.full(counts[t], k) for k, t in enumerate(NODE_TYPES)]).astype(np.int64)
    src, dst, et = [], [], []

    def add(s, d, k):
        src.append(s)
        dst.append(d)
        et.append(k)

    R, C, P, I, K = (offsets[t][0] for t in ("region", "cloud", "pool", "instance", "class"))
    for r, c in enumerate(region_cloud):
        add(R + r, C + c, 0)
    for p, r in enumerate(pool_region):
        add(P + p, R + r, 1)
    for i, p in enumerate(inst_pool):
        add(I + i, P + p, 2)
    for k in range(n_classes):
        for r in range(n_regions):
            add(K + k, R + r, 3)
        for p in range(len(pool_region)):
            add(K + k, P + p, 4)
    for a in range(n_regions):
        if region_degree is None:
            nb = [b for b in range(n_regions) if b != a]
        else:
            nb = sorted({(a + d) % n_regions for d in range(-(region_degree // 2), region_degree // 2 + 1)} - {a})
        for b in nb:
            add(R + a, R + b, 5)
    return GraphLayout(offsets, np.array([src, dst], np.int64), np.array(et, np.int64), node_type)


def graph_features(mc: MultiCloud, lay: GraphLayout, rule_gpu: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Node features (N, F_NODE) and edge attributes (E, F_EDGE) of the current state. ``rule_gpu``: the rule's
    GPU decision per pool now (world codes), shown on the pool nodes (the learned action corrects it)."""
    cfg, sim, now = mc.cfg, mc.sim, mc.sim.now
    x = np.zeros((lay.num_nodes, F_NODE), np.float32)
    ea = np.zeros((lay.edge_index.shape[1], F_EDGE), np.float32)
    C, R, P, I, K = (lay.offsets[t][0] for t in NODE_TYPES)
    nreg = len(cfg.regions)
    gpus_on_region = np.zeros(nreg)
    busy_region = np.zeros(nreg)
    pool_backlog = np.zeros(len(mc.pools))
    for pi, p in enumerate(mc.pools):
        on = [i for i in p.replicas if mc.inst[i].on]
        ready = [i for i in on if now >= mc.inst[i].ready_s]
        spot = [i for i in on if mc.inst[i].spot]
        bl = np.mean([mc.backlog_s(i, now) for i in ready]) if ready else 0.0
        bf = float(np.mean(mc.busy_frac[p.replicas])) * p.spec.max_replicas / max(len(on), 1)
        pool_backlog[pi] = bl
        v = np.zeros(2)
        v[min(p.spec.variant, 1)] = 1
        x[P + pi] = [p.od_usd_per_gpu_h / 50, p.spot_usd_per_gpu_h / 50, v[0], v[1], p.spec.tp / 8,
                     len(ready) / p.spec.max_replicas, (len(on) - len(ready)) / p.spec.max_replicas,
                     len(spot) / p.spec.max_replicas, min(bf, 1.0), min(bl / 30, 2.0), len(on) / p.spec.max_replicas,
                     mc.spot_frac(p.region, now), 0.0, 0.0, 0.0]
        # provisioning delay: this pool's (VM start + weights), and the time until its provisioning replicas are ready
        prov = [mc.provisioning_left_s(i, now) for i in on if now < mc.inst[i].ready_s]
        x[P + pi, 12:15] = [p.provision_s / 120, (max(prov) if prov else 0.0) / 120,
                            0.0 if rule_gpu is None else float([0, -1, 1, 1][int(rule_gpu[pi])])]
        gpus_on_region[p.region] += len(on) * p.spec.tp
        busy_region[p.region] += float(np.sum(mc.busy_frac[p.replicas])) * p.spec.tp
    for c in range(len(mc.clouds)):
        x[C + c, c] = 1.0
        x[C + c, 3] = sum(gpus_on_region[r] for r in range(nreg) if region_of(cfg.regions[r]).cloud == mc.clouds[c]) / 64
    ow = np.asarray(cfg.origin_weights, float)
    ow = ow / ow.sum()
    for r in range(nreg):
        x[R + r, :5] = [ow[r], mc.spot_frac(r, now), gpus_on_region[r] / 32,
                        busy_region[r] / max(gpus_on_region[r], 1), float(np.mean(mc.rtt[r]) / 0.2)]
    for i, st in enumerate(mc.inst):
        rep = sim.replicas[i]
        x[I + i, :7] = [st.on, st.on and now >= st.ready_s, st.spot, min(rep.outstanding / 64, 2.0),
                        min(mc.backlog_s(i, now) / 30, 2.0), mc.busy_frac[i], mc.provisioning_left_s(i, now) / 120]
    for k, c in enumerate(cfg.classes):
        x[K + k, min(k, 3)] = 1.0
        x[K + k, 4:10] = [mc.cls_arrivals[k] / 50, mc.cls_slo[k], min(c.ttft_s / 10, 6.0), c.tpot_s,
                          mc.variant[k] / max(len(cfg.variants) - 1, 1), c.quality_weight / 2]
    # edge attributes
    src, dst = lay.edge_index
    for e in range(len(src)):
        t = lay.edge_type[e]
        s, d = src[e], dst[e]
        if t == 1:
            p = mc.pools[s - P]
            ea[e] = [0, p.od_usd_per_gpu_h * p.spec.tp / 50, x[s, 8], 0]
        elif t == 2:
            ea[e] = [0, 0, x[s, 5], 0]
        elif t == 3:
            ea[e] = [0, 0, 0, ow[d - R]]
        elif t == 4:
            p = mc.pools[d - P]
            ea[e] = [float(ow @ mc.rtt[:, p.region]) / 0.2, p.od_usd_per_gpu_h * p.spec.tp / 50,
                     min(pool_backlog[d - P] / 30, 2.0), float(p.spec.variant == mc.variant[s - K])]
        elif t == 5:
            a, b = s - R, d - R
            ea[e] = [mc.rtt[a, b] / 0.2, mc.egress[a, b] / 0.2, 0, 0]
    return x, ea
