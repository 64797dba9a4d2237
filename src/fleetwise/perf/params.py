"""Fitted constants of the performance model (generated; do not edit by hand).

Source: Vidur profiling data (microsoft/vidur @ 7d47513, see <data>/vidur-profiling/PROVENANCE.md):
compute/{a100,a40,h100}/*/*/mlp.csv.gz, network/*/{all_reduce,send_recv}.csv.gz,
legacy-a100-llama-2-70b-tp2-attention.csv.gz, legacy-a100-llama-2-70b-tp2-cpu_overheads.csv.gz.
Regenerate: python -m fleetwise.perf.calibrate --write
Units: seconds, bytes, dimensionless efficiencies relative to the catalog's peak FLOP/s, memory and link bandwidth.
"""

# profile -> linear-op constants; 128x128 output tiles, waves over the GPU's SMs (GPU_SMS below)
GEMM = {
    "a100": {"eff_compute": 0.746155, "eff_mem": 0.720152, "wave_quant": 0.101283, "k_pad": 70.2658, "t0_s": 4.66524e-06},
    "a40": {"eff_compute": 0.793164, "eff_mem": 0.73696, "wave_quant": 0.195696, "k_pad": 128.156, "t0_s": 3.09412e-06},
    "h100": {"eff_compute": 0.719079, "eff_mem": 0.910228, "wave_quant": 0.228832, "k_pad": 0.001, "t0_s": 6.79271e-06},
}

# op -> (t0_s, eff_mem)
SMALL = {
    "a100": {
        "input_layernorm": (2.4126e-06, 0.368758),
        "attn_rope": (2.33546e-06, 0.44762),
        "post_attention_layernorm": (2.42564e-06, 0.355667),
        "mlp_act": (2.06735e-06, 0.494775),
        "add": (1.18834e-06, 0.929441),
        "emb": (2.55747e-06, 0.154145),
    },
    "a40": {
        "input_layernorm": (2.46107e-06, 0.60706),
        "attn_rope": (1.12688e-06, 0.783707),
        "post_attention_layernorm": (2.70033e-06, 0.604707),
        "mlp_act": (1.49281e-06, 0.780349),
        "add": (6.7568e-07, 0.849974),
        "emb": (1.94576e-06, 0.508271),
    },
    "h100": {
        "input_layernorm": (2.74742e-06, 0.448261),
        "attn_rope": (1.91502e-06, 0.512914),
        "post_attention_layernorm": (2.30345e-06, 0.38317),
        "mlp_act": (1.79425e-06, 0.582705),
        "add": (1.00979e-06, 1.09045),
        "emb": (2.41436e-06, 0.187656),
    },
}

# measured on A100 with the Llama-2-70B TP2 shape; transfers to other GPUs via peak / bandwidth
ATTENTION = {
    "prefill_t0_s": 2.33608e-05,
    "prefill_eff_compute": 0.374475,
    "decode_t0_s": 1.5791e-05,
    "decode_seq_bytes": 19363.3,
    "decode_eff_mem": 0.777995,
}

# fabric -> all_reduce: ((workers, latency_s, bandwidth efficiency), ...), intra-node rows only
COMM = {
    "a100_dgx": {
        "all_reduce": ((2, 4.42045e-05, 0.567623), (4, 3.79475e-05, 0.532212), (8, 4.33294e-05, 0.505196), ),
        "send_recv_lat_s": 1.34082e-05,
        "send_recv_eff_bw": 0.932943,
    },
    "a100_pairwise_nvlink": {
        "all_reduce": ((2, 4.26645e-05, 0.662539), (4, 5.79187e-05, 0.0786464), ),
        "send_recv_lat_s": 7.84442e-06,
        "send_recv_eff_bw": 1.19329,
    },
    "a40_pairwise_nvlink": {
        "all_reduce": (),
        "send_recv_lat_s": 2.18195e-06,
        "send_recv_eff_bw": 0.0734519,
    },
    "h100_dgx": {
        "all_reduce": ((2, 2.63979e-05, 0.728286), (4, 3.30352e-05, 0.863642), (8, 2.97283e-05, 0.758622), ),
        "send_recv_lat_s": 7.67143e-06,
        "send_recv_eff_bw": 0.794504,
    },
    "h100_pairwise_nvlink": {
        "all_reduce": ((2, 1.71506e-05, 0.441879), (4, 2.88127e-05, 0.103583), ),
        "send_recv_lat_s": 7.84443e-06,
        "send_recv_eff_bw": 0.795527,
    },
}

# measured with CodeLlama-34B TP2 on A100 (the only rows in the data)
CPU = {
    "base_s": 0.000868611,
    "per_seq_s": 3.62624e-05,
    "multi_gpu_base_s": 0.00230482,
    "multi_gpu_per_seq_s": 3.25921e-05,
}

# catalog GPU -> measured GPU whose efficiencies it takes (see perf/calibrate.py)
GPU_PROFILE = {
    "A100-80GB": "a100",
    "A40": "a40",
    "H100-80GB": "h100",
    "H200": "h100",
    "L4": "a40",
    "L40S": "a40",
    "T4": "a40",
    "Jetson-AGX-Orin-64GB": "a40",
}

# catalog GPU -> (all_reduce fabric, send_recv fabric)
GPU_FABRIC = {
    "A100-80GB": ("a100_dgx", "a100_dgx"),
    "A40": ("a100_pairwise_nvlink", "a40_pairwise_nvlink"),
    "H100-80GB": ("h100_dgx", "h100_dgx"),
    "H200": ("h100_dgx", "h100_dgx"),
    "L4": ("a100_dgx", "a100_dgx"),
    "L40S": ("a100_dgx", "a100_dgx"),
    "T4": ("a100_dgx", "a100_dgx"),
    "Jetson-AGX-Orin-64GB": ("a100_dgx", "a100_dgx"),
}

# catalog GPU -> streaming multiprocessors (datasheets; GEMM wave quantisation)
GPU_SMS = {
    "A100-80GB": 108,
    "A40": 84,
    "H100-80GB": 132,
    "H200": 132,
    "L4": 58,
    "L40S": 142,
    "T4": 40,
    "Jetson-AGX-Orin-64GB": 16,
}
