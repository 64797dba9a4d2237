"""The platform layer (issue 8): autoscaling with cold starts, spot and on-demand pools, tenants' quotas and
admission control, faults and failover, cost accounting and monitoring, on top of the simulator.
See docs/platform.md."""


def run_platform(scenario, seed: int | None = None, *, scaler=None, workload=None, progress=None, monitor=True):
    """Build ``scenario`` (a Scenario) and run it with the platform layer; returns the Platform (with
    ``records``, ``summary``) — ``scaler`` is a registered name, a PolicyRef-like dict, or a Scaler object;
    default: the scenario's ``scaler`` (``hpa`` if it has none)."""
    from fleetwise.platform.runner import Platform
    from fleetwise.policies import make
    from fleetwise.scenario import PolicyRef, build

    seed = scenario.seed if seed is None else seed
    built = build(scenario, seed, workload=workload)
    if scaler is None or isinstance(scaler, (str, dict)):
        ref = PolicyRef.model_validate(scaler) if scaler is not None else (scenario.scaler or PolicyRef(name="hpa"))
        scaler = make("scaler", ref.name, ref.params, where="scaler: ")
    p = Platform(built, scaler, seed=seed, monitor=monitor)
    p.records = p.run(progress=progress)
    p.summary = p.results(p.records)
    return p
