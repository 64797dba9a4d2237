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
