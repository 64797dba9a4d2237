"""Would a published "Hopper-class attention" factor fix the uncalibrated H200? (docs/perf-model.md, "Measured on
the H200 timings"). The FlashAttention-3 paper (Shah et al. 2024, abstract) reports FA3 1.5-2.0x faster than
FlashAttention-2 on the H100 (FA2 at 35% of the H100's peak, FA3 up to 75%). This multiplies the uncalibrated
model's prefill attention efficiency (transferred from Vidur's A100 FlashAttention measurement) by such a factor
and prints ``fleetwise perf validate``'s uncalibrated rows on the H200 operator timings: MAPE % (median signed %).
Nothing is fitted; the factor is not a setting of the model.

    PYTHONPATH=src FLEETWISE_DATA=../shared/data python benchmarks/h200-hopper-factor-probe.py [--factors 1,1.5,1.73,2]

(2026-12-06, about 20 s on 2 cores.)
"""

import argparse
from dataclasses import replace

import fleetwise.perf.validate_profile as vp
from fleetwise.data import data_path
from fleetwise.perf.calibration import default_calibration
from fleetwise.perf.profile_data import load_profile

ROWS = ("prefill whole", "chunked", "prefill", "layer prefill", "layer decode")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--factors", default="1,1.5,1.73,2")
    args = ap.parse_args()
    p = load_profile(data_path("h200-operator-timings") / "h200-ops-2026-11-30.json")
    base = default_calibration()
    print(f"{'factor':>7} " + " ".join(f"{r:>16}" for r in ROWS))
    for f in (float(x) for x in args.factors.split(",")):
        cal = replace(base, attention=replace(base.attention,
                                              prefill_eff_compute=base.attention.prefill_eff_compute * f))
        vp.default_calibration = lambda cal=cal: cal  # the uncalibrated rows use the default calibration
        res = vp.validate_profile(p)
        row = next(v for k, v in res.items() if k.startswith("uncalibrated"))
        print(f"{f:>7.2f} " + " ".join(f"{row[r]['mape']:>7.1f} ({row[r]['median']:+6.1f})" for r in ROWS))


if __name__ == "__main__":
    main()
