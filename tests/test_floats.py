"""The floating-point kernels pinned at import (fleetwise/floats.py): the same trained networks on every x86-64 host."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fleetwise import floats

X86_AVX2 = floats.portable_env().get("ATEN_CPU_CAPABILITY") == "avx2"


def test_portable_env_by_machine():
    full = floats.portable_env("x86_64", avx2=True)
    assert full == {"MKL_CBWR": "COMPATIBLE", "NPY_DISABLE_CPU_FEATURES": floats.NUMPY_AVX512,
                    "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "OPENBLAS_CORETYPE": "Haswell"}
    # without AVX2 nothing is forced that the CPU could not run
    assert set(floats.portable_env("AMD64", avx2=False)) == {"MKL_CBWR", "NPY_DISABLE_CPU_FEATURES",
                                                             "ONEDNN_MAX_CPU_ISA"}
    assert floats.portable_env("aarch64", avx2=True) == {}
    assert floats.portable_env("arm64") == {}


def test_pin_keeps_what_the_user_set_and_the_opt_out_keeps_everything():
    env = {"MKL_CBWR": "AUTO"}
    set_now = floats.pin(env, machine="x86_64", avx2=True)
    assert env["MKL_CBWR"] == "AUTO" and "MKL_CBWR" not in set_now
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and set_now["ATEN_CPU_CAPABILITY"] == "avx2"
    assert floats.pin(env, machine="x86_64", avx2=True) == {}  # idempotent
    for v in ("1", "true", "YES"):
        env = {floats.OPT_OUT: v}
        assert floats.pin(env, machine="x86_64", avx2=True) == {} and env == {floats.OPT_OUT: v}


def _run(code: str, **env: str) -> str:
    e = {k: v for k, v in os.environ.items() if k not in floats.portable_env("x86_64", avx2=True)}
    e.pop(floats.OPT_OUT, None)
    e.update(env)
    return subprocess.run([sys.executable, "-W", "always", "-c", code], env=e, capture_output=True, text=True,
                          check=True, timeout=120).stdout.strip()


# a torch product and an elementwise op (MKL's GEMM, torch's vectorised kernels), and a numpy product (OpenBLAS)
PRODUCTS = """
import hashlib, fleetwise, numpy as np, torch
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
a, b = torch.randn(64, 256, generator=g), torch.randn(256, 96, generator=g)
t = torch.tanh(a @ b).exp()
r = np.random.default_rng(0)
n = r.standard_normal((300, 700)) @ r.standard_normal((700, 200))
print(torch.backends.cpu.get_cpu_capability(), hashlib.sha256(t.numpy().tobytes() + n.tobytes()).hexdigest())
"""


@pytest.mark.skipif(not X86_AVX2, reason="pins only on x86-64 with AVX2")
def test_import_pins_the_kernels_and_a_host_with_less_gets_the_same_numbers():
    pytest.importorskip("torch")
    pinned = _run(PRODUCTS)
    assert pinned.split()[0] == "AVX2"
    # MKL told it has AVX2 at most (as on an AVX2-only CPU): the same products, bit for bit
    assert _run(PRODUCTS, MKL_ENABLE_INSTRUCTIONS="AVX2") == pinned
    native = _run(PRODUCTS, **{floats.OPT_OUT: "1"})
    assert native.split()[0] == _run("import torch; print(torch.backends.cpu.get_cpu_capability())")


@pytest.mark.skipif(not X86_AVX2, reason="pins only on x86-64 with AVX2")
def test_training_warns_when_torch_chose_its_kernels_before_fleetwise_was_imported():
    pytest.importorskip("torch")
    if _run("import torch; print(torch.backends.cpu.get_cpu_capability())") == "AVX2":
        pytest.skip("this CPU's own kernels are the pinned ones")
    code = ("import warnings, torch; torch.ones(2) + 1\nimport fleetwise\nfrom fleetwise.floats import check_torch\n"
            "with warnings.catch_warnings(record=True) as w:\n    warnings.simplefilter('always')\n"
            "    check_torch(torch); check_torch(torch)\nprint(len(w), w[0].message if w else '')")
    out = _run(code)
    assert out.startswith("1 ") and "ran before fleetwise was imported" in out
    ok = "import fleetwise, torch\nfrom fleetwise.floats import check_torch\nprint(check_torch(torch))"
    assert _run(ok) == "AVX2"
