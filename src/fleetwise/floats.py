"""Same seed, same numbers on every x86-64 host with AVX2: the CPU floating-point kernels of the libraries pinned.

Each of these libraries picks its CPU code by the vector units it finds, and their AVX-512 and AVX2 kernels round
differently (torch's vectorised ops and MKL's GEMM blocking; numpy's AVX-512 transcendental functions). One
matrix product differs in its last bits; a training run, a long chain of such products fed back into the
simulator, then takes another course on an AVX-512 host than on an AVX2 one (docs/experiments.md, "Same seed, same
numbers"). Each library reads an environment variable the first time it needs it, so :func:`pin` sets them
(without overriding one the user set) when ``fleetwise`` is imported:

- ``ATEN_CPU_CAPABILITY=avx2``: torch's AVX2 kernels (only on a CPU that has AVX2, which every x86-64 server CPU
  since 2013 has; torch would run them anyway on one without AVX-512);
- ``MKL_CBWR=COMPATIBLE``: MKL's conditional numerical reproducibility mode whose results are the same on Intel and
  AMD processors (its ``AVX2`` mode holds on Intel processors only);
- ``NPY_DISABLE_CPU_FEATURES``: numpy's AVX-512 dispatch off, and ``OPENBLAS_CORETYPE=Haswell``: the AVX2 kernels
  and blocking of the OpenBLAS numpy links (both read when numpy is imported: effective when ``fleetwise`` is
  imported first, as the ``fleetwise`` command and its worker processes do);
- ``ONEDNN_MAX_CPU_ISA=AVX2`` for the oneDNN kernels torch may use.

The simulator's results did not move with them (`fleetwise simulate` and the demo's sweep printed the same bytes
pinned and not); what they fix is learning: the same training seed gives the same networks on any x86-64 host
with AVX2. For the small networks trained here
the cost is within the run-to-run spread (docs/experiments.md). ``FLEETWISE_NATIVE_KERNELS=1`` keeps each
library's own choice (the fastest kernels of the host, and results that depend on it). Other architectures (ARM)
are left alone: their kernels are their own.
"""

from __future__ import annotations

import os
import platform
from collections.abc import MutableMapping

# numpy's dispatch targets above AVX2, in numpy 2's names and numpy 1's (numpy 2.4 ignores the names it lacks)
NUMPY_AVX512 = ("X86_V4 AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL "
                "AVX512_SPR")
OPT_OUT = "FLEETWISE_NATIVE_KERNELS"


def _has_avx2() -> bool | None:
    """Whether this CPU has AVX2 and FMA (Linux's /proc/cpuinfo); None where that cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return "avx2" in flags and "fma" in flags
    except OSError:
        return None
    return None


def portable_env(machine: str | None = None, avx2: bool | None = None) -> dict[str, str]:
    """The environment variables that pin the kernels on this machine (empty off x86-64)."""
    machine = (machine or platform.machine()).lower()
    if machine not in ("x86_64", "amd64"):
        return {}
    env = {"MKL_CBWR": "COMPATIBLE", "NPY_DISABLE_CPU_FEATURES": NUMPY_AVX512, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    if avx2 if avx2 is not None else _has_avx2():  # (a CPU without AVX2 could not run these kernels)
        env["ATEN_CPU_CAPABILITY"] = "avx2"
        env["OPENBLAS_CORETYPE"] = "Haswell"
    return env


def pin(environ: MutableMapping[str, str] | None = None, **kw) -> dict[str, str]:
    """Set the variables of :func:`portable_env` that are not set yet (none with ``FLEETWISE_NATIVE_KERNELS=1``);
    returns what was set. Child processes (``--workers``, Ray's local workers) inherit them."""
    environ = os.environ if environ is None else environ
    if environ.get(OPT_OUT, "").strip().lower() in ("1", "true", "yes", "on"):
        return {}
    set_now = {k: v for k, v in portable_env(**kw).items() if k not in environ}
    environ.update(set_now)
    return set_now


_warned = False


def check_torch(torch) -> str:
    """torch's CPU kernels in this process (``AVX2``, ``AVX512``, ...; asking fixes its choice, as its first operation
    would); warns once when they are not the pinned ones: torch ran before ``fleetwise`` was imported."""
    global _warned
    cap = str(torch.backends.cpu.get_cpu_capability())
    want = os.environ.get("ATEN_CPU_CAPABILITY", "")
    if want and cap.lower() != want.lower() and not _warned:
        _warned = True
        import warnings

        warnings.warn(f"torch runs its {cap} CPU kernels, not {want.upper()}: it ran before fleetwise was imported, so "
                      f"trained networks may differ from another host's (import fleetwise first; fleetwise/floats.py)",
                      RuntimeWarning, stacklevel=2)
    return cap
