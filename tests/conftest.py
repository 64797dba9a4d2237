import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def data_dir():
    from fleetwise.data import data_dir as find

    d = find(required=False)
    if d is None:
        pytest.skip("real datasets not found (set FLEETWISE_DATA)")
    return d


@pytest.fixture(scope="session")
def local_ray(tmp_path_factory):
    """One local Ray per test session, every packet on loopback (shared/notes/ray-on-loopback.md; the Ray tests run
    inside scripts/loopback-ns: `make test`)."""
    env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/", "http_proxy": "http://127.0.0.1:9",
           "https_proxy": "http://127.0.0.1:9", "no_proxy": "localhost,127.0.0.1,::1", "RAY_AUTH_MODE": "disabled",
           "RAY_TMPDIR": str(tmp_path_factory.mktemp("ray"))}
    os.environ.update(env)
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
