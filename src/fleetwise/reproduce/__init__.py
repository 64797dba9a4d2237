"""Paper reproductions: ``fleetwise reproduce NAME``. Each module here exposes

    run(quick: bool, seeds: int | None, eval_trace: str | None, db: str | None) -> dict   # the --json object
    render(result: dict) -> rich renderable                                               # the table
    bench() -> dict                                      # `fleetwise bench env-steps NAME`: steps per second

and stores its runs, learning curves and plots through ``fleetwise.experiments``.
"""

PAPERS = {
    "allocation": "Q-learning vs SARSA vs fixed policy for GPU count and parallelism (planetlab CPU traces)",
    "batching": "DISPPO: semi-Markov PPO for prefill/decode batching at edge nodes",
    "torta": "TORTA: RL + optimal transport across regions, switching-aware micro allocation",
    "graph-marl": "Graph-MARL-CloudLLM: heterogeneous GNN + MAPPO across clouds",
    "platform": "platform autoscaling (HPA, SLO-aware, predictive, RL) with spot, tenants and faults",
}
