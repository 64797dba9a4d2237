"""fleetwise: decide and learn how an LLM inference fleet spends its GPUs.

The Python API in two names: ``load_scenario(path_or_name)`` and ``simulate(scenario, seed, router=...)`` ->
(records, summary) (imported on first use, so ``import fleetwise`` stays light).
"""

from fleetwise import floats as _floats

_floats.pin()  # before numpy or torch load: the same kernels on every x86-64 host (fleetwise/floats.py)

__version__ = "0.1.0"
__all__ = ["load_scenario", "run_scenario", "simulate"]


def __getattr__(name: str):
    if name == "load_scenario":
        from fleetwise.scenario import load_scenario

        return load_scenario
    if name in ("simulate", "run_scenario"):
        from fleetwise import run

        return getattr(run, name)
    raise AttributeError(f"module 'fleetwise' has no attribute {name!r}")


def __dir__() -> list[str]:  # (tab completion listed neither lazy name)
    return sorted(set(globals()) | set(__all__))
