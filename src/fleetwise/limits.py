"""Bounds on what one input may ask for, checked up front (before any allocation or simulation).

Every bound is documented with its reason in docs/limits.md; a value beyond one is bad input (an
:class:`~fleetwise.errors.InputError`: one line, exit status 2). Imports nothing from the project, so every
layer may use it.
"""

from __future__ import annotations

# requests of one run: the simulator holds ~0.43 KB per request (bench sim-speed on 2026-12-07: 122 MB at 100k,
# 209 MB at 300k requests), so 10 M requests are ~4.3 GB and ~7 minutes at the 24.6k requests/s measured then
# (docs/limits.md)
MAX_REQUESTS = 10_000_000
# simulated time covered by arrivals (a generator's duration_s or num_requests / rate, a trace's span), and any
# other time in a scenario (fault times, billing windows): one leap year
MAX_SPAN_S = 366 * 86_400.0
# tokens of one request's prompt or output: above the largest context window on offer (10 M, Llama 4 Scout);
# keeps token sums far from int64 overflow
MAX_TOKENS = 10_000_000
# replicas of one deployment, and all replicas (initial or, with a scaler, max_replicas) of a scenario
MAX_REPLICAS = 10_000
# tokens per KV-cache block of a deployment (vLLM 16; Mooncake's prefix blocks are 512): each replica keeps a
# per-phase histogram of this length, so 300,000 x 2,000 replicas was a MemoryError at 3.7 GB
MAX_BLOCK_TOKENS = 1024
# regions of a synthetic topology (the fleet keeps n x n matrices of RTT, bandwidth and prices)
MAX_REGIONS = 1_000
# seeds: numpy takes any integer >= 0; the results store keeps them as BIGINT
MAX_SEED = 2**63 - 1
# the seed of a training search (train scaler, train router): its runs' seeds are derived as seed x 1000 + k,
# which must stay a valid seed (10**16 failed after the training had started)
MAX_TRAIN_SEED = 2**53
# seeds of one experiment, and runs of one expanded experiment (scenarios x grid x policies x seeds)
MAX_SEEDS = 1_000
MAX_RUNS = 100_000
# platform layer: scaling epochs and monitoring samples are periodic events; at least this long, and at most
# MAX_PERIODIC_EVENTS of each over the simulated horizon (a year of 30 s epochs is ~1 M)
MIN_PERIOD_S = 1.0
MAX_PERIODIC_EVENTS = 1_100_000
# experiment timelines: per-replica utilisation buckets
MIN_TIMELINE_BUCKET_S = 0.01
MAX_TIMELINE_BUCKETS = 1_000_000
# MMPP arrivals: state switches are drawn one by one, so their expected number over the arrival span is bounded
MAX_MMPP_SWITCHES = 1_000_000
# a Gamma renewal process's coefficient of variation (shape = 1 / cv^2; beyond ~100 the gaps underflow to 0)
MAX_CV = 100.0  # (and at least 1 / MAX_CV)
# processes a command may start (--workers of sweep / compare / reproduce, bench gateway --servers): each
# imports numpy and the simulator (~100 MB)
MAX_WORKERS = 256
# a file a user writes by hand or a tool writes for them, read whole and parsed (a scenario, an experiment, a
# topology, a calibration or a profile; fleetwise.yamlio.read_text): the largest such file here is 110 KB (the H200
# operator timings), and PyYAML's safe loader parses a few MB a second
MAX_FILE_BYTES = 64 * 2**20
# values a YAML document with aliases may expand to (every alias copied out): PyYAML shares an aliased node, so a
# few lines of nested aliases (a "billion laughs") load in no memory but expand to 9^9 values the moment a sweep
# grid, a label or a validator walks them; no file here uses aliases, the largest holds about 20,000 values
MAX_ALIAS_VALUES = 1_000_000
# characters of one line of a request trace (CSV or JSONL, maybe gzipped): a row is a few numbers, and a Mooncake
# line with a 10 M-token prompt holds 19,532 block ids (about 400 KB); a line is read whole, so a gzipped line of
# spaces (1,000:1) took 4 GB before a field was looked at
MAX_LINE_CHARS = 1 << 20
# files a folder of CPU-utilisation traces may hold (reproduce allocation --eval-trace FOLDER; workload/cpu.py reads
# it recursively): the PlanetLab archive holds 11,746 series in 10 day folders, as one archive file
MAX_TRACE_FILES = 100_000
