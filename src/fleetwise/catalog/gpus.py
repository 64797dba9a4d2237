"""GPU catalog: public datasheet figures and cloud list prices, each with its source.

Conventions (see catalog/specs.py):
- ``tflops_bf16``: dense (no structured sparsity) BF16/FP16 tensor-core peak from the vendor datasheet.
- ``memory_gb``: the nominal memory size from the datasheet (GB = 1e9 bytes). nvidia-smi reports slightly more
  (e.g. 81920 MiB = 85.9e9 B on A100-80GB); using the nominal figure is a small conservative margin.
- ``interconnect_gbps``: GPU-to-GPU bandwidth per GPU *per direction*: half the datasheet's bidirectional NVLink
  figure, or PCIe per-direction bandwidth where a GPU has no NVLink.
- ``idle_w``: typical idle draw read by nvidia-smi on an otherwise idle server (rounded, approximate; not a
  datasheet figure). ``max_w``: datasheet TDP / max board power.
- Prices: USD per GPU-hour = instance list price / GPUs in the instance, Linux, us-east-1 / us-central1 /
  East US, as listed on the clouds' public pricing pages in 2024. Spot prices move daily: the values are
  typical mid-2024 figures from the clouds' spot pricing pages / spot price history and are marked so.
  A cloud that does not sell the GPU is absent from ``prices``.
"""

from __future__ import annotations

from fleetwise.catalog.specs import GPUSpec, Price

A100_80GB = GPUSpec(
    name="A100-80GB",
    # NVIDIA A100 Tensor Core GPU datasheet (2021), SXM4 80GB: BF16 tensor 312 TFLOPS dense (624 with sparsity)
    tflops_bf16=312.0,
    memory_gb=80.0,  # datasheet: 80GB HBM2e
    mem_bw_gbps=2039.0,  # datasheet: 2,039 GB/s (SXM 80GB)
    interconnect_gbps=300.0,  # datasheet: NVLink 3 600 GB/s bidirectional -> 300 GB/s per direction
    idle_w=60.0,  # typical nvidia-smi idle reading, SXM4 (approximate)
    max_w=400.0,  # datasheet: max TDP 400 W (SXM)
    prices={
        # AWS p4de.24xlarge (8x A100 80GB) us-east-1 on-demand $40.966/h / 8; spot typical ~$15/h / 8 (spot history, 2024)
        "aws": Price(on_demand_usd_per_hour=5.12, spot_usd_per_hour=1.90),
        # GCP a2-ultragpu-1g (1x A100 80GB) us-central1 on-demand $5.07/h (VM incl. GPU); spot ~$1.57/h (GCP VM pricing page, 2024)
        "gcp": Price(on_demand_usd_per_hour=5.07, spot_usd_per_hour=1.57),
        # Azure ND96amsr A100 v4 (8x A100 80GB) East US pay-as-you-go $32.77/h / 8; spot ~$13.1/h / 8 (Azure pricing page, 2024)
        "azure": Price(on_demand_usd_per_hour=4.10, spot_usd_per_hour=1.64),
    },
    pcie_gbps=32.0,  # PCIe Gen4 x16 per direction
    gpus_per_node=8,
)

A40 = GPUSpec(
    name="A40",
    # NVIDIA A40 datasheet (2021): BF16/FP16 tensor 149.7 TFLOPS dense (299.4 with sparsity)
    tflops_bf16=149.7,
    memory_gb=48.0,  # datasheet: 48 GB GDDR6 with ECC
    mem_bw_gbps=696.0,  # datasheet: 696 GB/s
    interconnect_gbps=56.25,  # datasheet: NVLink bridge 112.5 GB/s bidirectional between a pair -> 56.25 per direction
    idle_w=30.0,  # typical nvidia-smi idle reading (approximate)
    max_w=300.0,  # datasheet: max power 300 W
    prices={},  # not sold by AWS, GCP or Azure (2024)
    pcie_gbps=32.0,  # PCIe Gen4 x16
    gpus_per_node=8,
)

H100_80GB = GPUSpec(
    name="H100-80GB",
    # NVIDIA H100 Tensor Core GPU datasheet (2023), H100 SXM: BF16 tensor 1,979 TFLOPS *with sparsity* -> 989.4 dense
    tflops_bf16=989.4,
    memory_gb=80.0,  # datasheet: 80 GB HBM3
    mem_bw_gbps=3350.0,  # datasheet: 3.35 TB/s
    interconnect_gbps=450.0,  # datasheet: NVLink 4 900 GB/s bidirectional -> 450 GB/s per direction
    idle_w=70.0,  # typical nvidia-smi idle reading, SXM5 (approximate)
    max_w=700.0,  # datasheet: max TDP up to 700 W
    prices={
        # AWS p5.48xlarge (8x H100) us-east-1 on-demand $98.32/h / 8; spot typical ~$30/h / 8 (spot history, 2024)
        "aws": Price(on_demand_usd_per_hour=12.29, spot_usd_per_hour=3.75),
        # GCP a3-highgpu-8g (8x H100) us-central1 on-demand ~$88.25/h / 8; spot ~$26.3/h / 8 (GCP VM pricing page, 2024)
        "gcp": Price(on_demand_usd_per_hour=11.03, spot_usd_per_hour=3.29),
        # Azure ND96isr H100 v5 (8x H100) East US pay-as-you-go $98.32/h / 8; spot ~$39/h / 8 (Azure pricing page, 2024)
        "azure": Price(on_demand_usd_per_hour=12.29, spot_usd_per_hour=4.90),
    },
    pcie_gbps=64.0,  # PCIe Gen5 x16 per direction
    gpus_per_node=8,
)

H200 = GPUSpec(
    name="H200",
    # NVIDIA H200 Tensor Core GPU datasheet (2024), H200 SXM: BF16 tensor 1,979 TFLOPS with sparsity -> 989.4 dense
    tflops_bf16=989.4,
    memory_gb=141.0,  # datasheet: 141 GB HBM3e
    mem_bw_gbps=4800.0,  # datasheet: 4.8 TB/s
    interconnect_gbps=450.0,  # datasheet: NVLink 900 GB/s bidirectional -> 450 per direction
    idle_w=75.0,  # typical idle reading (approximate, assumed close to H100 SXM)
    max_w=700.0,  # datasheet: max TDP up to 700 W
    prices={
        # AWS p5e.48xlarge (8x H200) us-east-1 on-demand ~$113.9/h / 8 (AWS EC2 pricing, late 2024); spot typical ~$5/GPU-h (approx.)
        "aws": Price(on_demand_usd_per_hour=14.24, spot_usd_per_hour=5.00),
        # GCP a3-ultragpu-8g (8x H200) us-central1 on-demand ~$84.8/h / 8; spot ~$3.7/GPU-h (GCP pricing page, early 2025, approx.)
        "gcp": Price(on_demand_usd_per_hour=10.60, spot_usd_per_hour=3.70),
        # Azure ND96isr H200 v5 (8x H200) East US pay-as-you-go ~$110.2/h / 8 (Azure pricing page, early 2025, approx.)
        "azure": Price(on_demand_usd_per_hour=13.78, spot_usd_per_hour=None),
    },
    pcie_gbps=64.0,  # PCIe Gen5 x16
    gpus_per_node=8,
)

L4 = GPUSpec(
    name="L4",
    # NVIDIA L4 datasheet (2023): BF16/FP16 tensor 242 TFLOPS with sparsity -> 121 dense
    tflops_bf16=121.0,
    memory_gb=24.0,  # datasheet: 24 GB GDDR6
    mem_bw_gbps=300.0,  # datasheet: 300 GB/s
    interconnect_gbps=32.0,  # no NVLink; PCIe Gen4 x16 ~32 GB/s per direction (datasheet: PCIe Gen4 x16 64 GB/s bidir)
    idle_w=16.0,  # typical nvidia-smi idle reading (approximate)
    max_w=72.0,  # datasheet: max power 72 W
    prices={
        # AWS g6.xlarge (1x L4) us-east-1 on-demand $0.8048/h; spot typical ~$0.35/h (spot history, 2024)
        "aws": Price(on_demand_usd_per_hour=0.80, spot_usd_per_hour=0.35),
        # GCP g2-standard-4 (1x L4) us-central1 on-demand $0.7068/h; spot ~$0.28/h (GCP VM pricing page, 2024)
        "gcp": Price(on_demand_usd_per_hour=0.71, spot_usd_per_hour=0.28),
        # Azure: no L4 VM series (2024)
    },
    pcie_gbps=32.0,
    gpus_per_node=8,
)

L40S = GPUSpec(
    name="L40S",
    # NVIDIA L40S datasheet (2023): BF16/FP16 tensor 733 TFLOPS with sparsity -> 362.05 dense
    tflops_bf16=362.05,
    memory_gb=48.0,  # datasheet: 48 GB GDDR6 with ECC
    mem_bw_gbps=864.0,  # datasheet: 864 GB/s
    interconnect_gbps=32.0,  # no NVLink; PCIe Gen4 x16 per direction
    idle_w=35.0,  # typical nvidia-smi idle reading (approximate)
    max_w=350.0,  # datasheet: max power 350 W
    prices={
        # AWS g6e.xlarge (1x L40S) us-east-1 on-demand $1.861/h; spot typical ~$0.75/h (spot history, 2024)
        "aws": Price(on_demand_usd_per_hour=1.86, spot_usd_per_hour=0.75),
        # GCP, Azure: no L40S VM series (2024)
    },
    pcie_gbps=32.0,
    gpus_per_node=8,
)

T4 = GPUSpec(
    name="T4",
    # NVIDIA T4 datasheet (2019): mixed-precision FP16/FP32 tensor 65 TFLOPS (Turing: no BF16; FP16 is used)
    tflops_bf16=65.0,
    memory_gb=16.0,  # datasheet: 16 GB GDDR6
    mem_bw_gbps=320.0,  # datasheet: 320+ GB/s
    interconnect_gbps=16.0,  # no NVLink; PCIe Gen3 x16 ~16 GB/s per direction
    idle_w=10.0,  # typical nvidia-smi idle reading (approximate)
    max_w=70.0,  # datasheet: 70 W
    prices={
        # AWS g4dn.xlarge (1x T4) us-east-1 on-demand $0.526/h; spot typical ~$0.16/h (spot history, 2024)
        "aws": Price(on_demand_usd_per_hour=0.526, spot_usd_per_hour=0.16),
        # GCP n1-standard-4 + 1x T4 us-central1: $0.35/h GPU + $0.19/h VM; spot ~$0.07 + $0.04 (GCP pricing page, 2024)
        "gcp": Price(on_demand_usd_per_hour=0.54, spot_usd_per_hour=0.11),
        # Azure NC4as T4 v3 (1x T4) East US pay-as-you-go $0.526/h; spot ~$0.12/h (Azure pricing page, 2024)
        "azure": Price(on_demand_usd_per_hour=0.526, spot_usd_per_hour=0.12),
    },
    pcie_gbps=16.0,
    gpus_per_node=8,
)

JETSON_AGX_ORIN_64GB = GPUSpec(
    name="Jetson-AGX-Orin-64GB",
    # NVIDIA Jetson AGX Orin series datasheet (2023): 64GB module, 275 sparse INT8 TOPS total of which 170 from the
    # Ampere GPU (2048 CUDA cores, 64 tensor cores, 1.3 GHz) -> 85 dense INT8 -> ~42.5 dense FP16 tensor TFLOPS (derived)
    tflops_bf16=42.5,
    memory_gb=64.0,  # datasheet: 64 GB LPDDR5, shared by CPU and GPU
    mem_bw_gbps=204.8,  # datasheet: 204.8 GB/s
    interconnect_gbps=1.25,  # single-GPU module; between modules only 10 GbE (1.25 GB/s)
    idle_w=10.0,  # module idle (approximate, 15-60 W configurable power modes)
    max_w=60.0,  # datasheet: 15 W - 60 W power modes
    prices={},  # an edge device: not rented by AWS/GCP/Azure
    pcie_gbps=8.0,  # PCIe Gen4 x8 NVMe path (datasheet: up to 22 lanes Gen4; storage typically x4/x8)
    gpus_per_node=1,
)

ALL_GPUS: tuple[GPUSpec, ...] = (A100_80GB, A40, H100_80GB, H200, L4, L40S, T4, JETSON_AGX_ORIN_64GB)

# lower-case alias -> canonical name
GPU_ALIASES: dict[str, str] = {
    "a100": "A100-80GB",
    "a100-80g": "A100-80GB",
    "a100-80gb": "A100-80GB",
    "a100_80gb": "A100-80GB",
    "a100-sxm": "A100-80GB",
    "a100-sxm4-80gb": "A100-80GB",
    "nvidia a100-sxm4-80gb": "A100-80GB",
    "a40": "A40",
    "nvidia a40": "A40",
    "h100": "H100-80GB",
    "h100-sxm": "H100-80GB",
    "h100-80g": "H100-80GB",
    "h100_80gb": "H100-80GB",
    "h100-sxm5-80gb": "H100-80GB",
    "nvidia h100 80gb hbm3": "H100-80GB",
    "h200": "H200",
    "h200-141gb": "H200",
    "h200-sxm": "H200",
    "nvidia h200": "H200",  # torch.cuda.get_device_name() on an H200 SXM
    "l4": "L4",
    "nvidia l4": "L4",
    "l40s": "L40S",
    "nvidia l40s": "L40S",
    "l40-s": "L40S",
    "t4": "T4",
    "tesla-t4": "T4",
    "tesla t4": "T4",
    "jetson": "Jetson-AGX-Orin-64GB",
    "orin": "Jetson-AGX-Orin-64GB",
    "agx-orin": "Jetson-AGX-Orin-64GB",
    "jetson-agx-orin": "Jetson-AGX-Orin-64GB",
    "jetson-orin": "Jetson-AGX-Orin-64GB",
    "jetson agx orin": "Jetson-AGX-Orin-64GB",
    "jetson agx orin 64gb": "Jetson-AGX-Orin-64GB",
}
