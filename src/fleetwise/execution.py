"""Where work runs: local worker processes (default) or Ray tasks (a local Ray or a cluster).

Sweeps (``fleetwise.experiments.runner``) and training jobs of learned policies (``fleetwise.learn.recipe``) use
the same two backends.
"""

from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Callable

from fleetwise.errors import InputError

POLL_S = 0.5  # how often a waiting caller hears from the backend (to flush finished results)


def check_workers(workers) -> None:
    """``workers``: None (all cores) or a whole number from 1 to ``limits.MAX_WORKERS`` (0 was taken as all
    cores, -3 failed in the process pool's own words)."""
    from fleetwise.limits import MAX_WORKERS

    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or not 1 <= workers <= MAX_WORKERS):
        raise InputError(f"workers {workers!r}: expected None (all cores) or a whole number from 1 to {MAX_WORKERS}")


def run_local(todo: list, workers: int | None, collect: Callable, fn: Callable, spawn: bool = False) -> None:
    """``collect(fn(x))`` for every item of ``todo`` in worker processes (in this process with one worker);
    ``collect(None)`` every ``POLL_S`` while waiting."""
    workers = workers or os.cpu_count() or 1
    if workers == 1:
        for r in todo:
            collect(fn(r))
        return
    ctx = None
    if spawn:  # the workers import torch themselves (a fork of a parent holding torch's threads can hang)
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=ctx) as pool:
        futures = {pool.submit(fn, r) for r in todo}
        try:
            while futures:
                finished, futures = wait(futures, timeout=POLL_S, return_when=FIRST_COMPLETED)
                for f in finished:
                    collect(f.result())
                if not finished:
                    collect(None)
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def run_tasks(fn: Callable, items: list, *, backend: str = "local", workers: int | None = None,
              address: str | None = None, on_result: Callable | None = None, spawn: bool = False) -> list:
    """``fn`` over ``items`` on a sweep backend (``local``: worker processes; ``ray``: Ray tasks, ``address`` for a
    cluster); the results in the order of ``items``. ``fn`` and the items must pickle (a module-level function).
    Training jobs of learned policies run here (``fleetwise.learn.recipe.run_jobs``)."""
    check_workers(workers)
    if not callable(fn):
        raise InputError(f"fn {fn!r:.60}: expected a function (module-level, so that it pickles)")
    tagged = [(k, fn, x) for k, x in enumerate(items)]
    out: list = [None] * len(items)

    def collect(res) -> None:
        if res is None:
            return
        k, value = res
        out[k] = value
        if on_result is not None:
            on_result(value)

    if backend == "local":
        run_local(tagged, workers, collect, _tagged, spawn=spawn)
    elif backend == "ray":
        run_ray(tagged, workers, address, collect, _tagged)
    else:
        raise InputError(f"--backend {backend!r}: expected local or ray")
    return out


def _tagged(item: tuple) -> tuple:
    k, fn, x = item
    return k, fn(x)


def _probe(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on an unreachable cluster (``ray.init`` itself retries for minutes)."""
    import socket

    hostport = address.split("://", 1)[-1]
    if hostport in ("auto", "local") or ":" not in hostport:
        return
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as e:
        raise InputError(f"--address {address}: cannot reach a Ray cluster there ({e})") from None


def run_ray(todo: list, workers: int | None, address: str | None, collect: Callable, fn: Callable) -> None:
    """``collect(fn(x))`` for every item of ``todo`` as Ray tasks (a local Ray, or the cluster at ``address``)."""
    try:
        import ray
    except ImportError:
        raise InputError("--backend ray needs Ray: pip install 'fleetwise[ray]'") from None
    if not ray.is_initialized():
        if address:
            _probe(address)
        try:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(address="local", num_cpus=workers or os.cpu_count(), include_dashboard=False,
                         log_to_driver=False)
        except Exception as e:  # unreachable cluster, bad address
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise InputError(f"--address {address}: cannot connect to a Ray cluster: {msg}") from None
    task = ray.remote(fn)
    refs = [task.remote(r) for r in todo]
    try:
        while refs:
            ready, refs = ray.wait(refs, num_returns=1, timeout=POLL_S)
            for ref in ready:
                collect(ray.get(ref))
            if not ready:
                collect(None)
    except BaseException:
        for ref in refs:
            ray.cancel(ref, force=True)
        raise
