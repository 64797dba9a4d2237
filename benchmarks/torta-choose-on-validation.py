"""TORTA's deployment choice among training seeds, on validation data only, judged on the held-out test days.

`fleetwise reproduce torta --train-seeds K` trains K agents per topology and reports them pooled. A user deploys
one: the checkpoint whose gate (4 validation days, never test days) passed with the largest cost saving; where
none passed, the rule (least_loaded) itself. This prints, per topology, the seed chosen that way and its paired
change against least_loaded on the test days of that run (mean [95% bootstrap CI] by day).

Usage: PYTHONPATH=src python benchmarks/torta-choose-on-validation.py RESULTS_DIR
       (RESULTS_DIR: the folder holding the run's --db file and torta/checkpoints/)
"""

import json
import sys
from pathlib import Path

import duckdb

from fleetwise.metrics.stats import paired_change

out = Path(sys.argv[1])
db = next(out.glob("*.duckdb"))
cards = out / "torta" / "checkpoints"
METRICS = ("response_time_mean_s", "cost_usd", "load_cv", "response_time_p99_s")
with duckdb.connect(str(db), read_only=True) as con:
    rows = con.sql("select scenario, router_label, seed, train_seed, " + ", ".join(METRICS) +
                   " from runs where experiment = 'reproduce-torta' and router_label in ('torta', 'least_loaded')"
                   ).fetchall()
for topo in sorted({r[0].removeprefix("torta-") for r in rows}):
    gates = {}
    for f in sorted(cards.glob(f"{topo}-torta-seed*.card.json")):
        v = json.loads(f.read_text()).get("validation") or {}
        gates[int(f.name.split("seed")[1].split(".")[0])] = v
    passed = {k: v for k, v in gates.items() if v.get("passed")}
    pick = min(passed, key=lambda k: passed[k]["change"]) if passed else None
    txt = ", ".join(f"seed {k}: {'passed' if v.get('passed') else 'not passed'} {v.get('change', 0):+.1%}"
                    for k, v in gates.items())
    if pick is None:
        print(f"{topo}: no gate passed ({txt}): the rule is deployed, change 0 by construction")
        continue
    rule = {r[2]: r for r in rows if r[0] == f"torta-{topo}" and r[1] == "least_loaded"}
    pol = {r[2]: r for r in rows if r[0] == f"torta-{topo}" and r[1] == "torta" and int(r[3]) == pick}
    parts = []
    for i, m in enumerate(METRICS):
        ch = paired_change({d: r[4 + i] for d, r in rule.items()}, {d: r[4 + i] for d, r in pol.items()})
        parts.append(f"{m} {ch.mean:+.1%} [{ch.lo:+.1%}, {ch.hi:+.1%}]")
    print(f"{topo}: seed {pick} chosen ({txt}); {len(pol)} test days vs least_loaded: " + "; ".join(parts))
