"""FLOPs per token, the vendors' peak TFLOP/s by device and precision, and MFU against them."""

from __future__ import annotations

import re
from typing import cast


def flops_per_token(matmul_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> int:
    """Training FLOPs per token, PaLM's convention (Chowdhery et al. 2022, appendix B): 6N + 12*L*H*Q*T.

    6N: forward (2N) and backward (4N) through the weight matmuls; 12LHQT: the
    attention scores and their weighted sum, forward and backward, no credit
    taken for the causal mask. Recomputation (checkpointing) is not counted:
    MFU counts useful work only.
    """
    return 6 * matmul_params + 12 * n_layer * n_head * head_dim * seq_len


# Dense peak TFLOP/s from the vendors' datasheets (with sparsity they quote twice these), by matmul precision.
# A device is named by torch.cuda.get_device_name(); `device_model` maps that name to one of these keys by its
# words, exactly (an "L40" is not an "L4"; an "H100 NVL" is not an SXM). A device not here has no MFU ("n/a").
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 SXM": {"fp8": 1978.9, "bf16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H100 PCIe": {"fp8": 1513.0, "bf16": 756.0, "tf32": 378.0, "fp32": 51.2},
    "H100 NVL": {"fp8": 1670.5, "bf16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "H200 SXM": {"fp8": 1978.9, "bf16": 989.4, "tf32": 494.7, "fp32": 66.9},  # the H100 SXM's chip, more memory
    "H200 NVL": {"fp8": 1670.5, "bf16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "A100": {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5},  # 40 GB and 80 GB, SXM and PCIe alike; no fp8
    "L40S": {"fp8": 733.0, "bf16": 362.0, "tf32": 183.0, "fp32": 91.6},
    "L40": {"fp8": 362.0, "bf16": 181.0, "tf32": 90.5, "fp32": 90.5},
    "L4": {"fp8": 242.5, "bf16": 121.0, "tf32": 60.0, "fp32": 30.3},
}


def device_model(device_name: str) -> str | None:
    """The PEAK_TFLOPS key of a CUDA device name, matched word by word; None for a device not in the table.

    Names as torch reports them: "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
    "NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA A100-SXM4-40GB", "NVIDIA A100 80GB PCIe", "NVIDIA L40S", ...
    """
    words = set(re.split(r"[\s\-_]+", device_name.upper()))
    for chip in ("H100", "H200"):
        if chip in words:
            return f"{chip} NVL" if "NVL" in words else f"{chip} PCIe" if "PCIE" in words else f"{chip} SXM"
    return next((key for key in ("A100", "L40S", "L40", "L4") if key in words), None)


def peak_tflops(device_name: str, precision: str) -> float | None:
    model = device_model(device_name)
    return PEAK_TFLOPS[model].get(precision) if model else None


def peak_for(override: dict[str, float] | None, device_name: str, device_type: str, precision: str) -> float | None:
    """The peak an MFU is taken against: --peak-tflops for this precision if given, else the table's (CUDA only)."""
    if override:
        return override.get(precision)
    return peak_tflops(device_name, precision) if device_type == "cuda" else None


def blended_peak(flops: dict[str, float], peaks: dict[str, float | None]) -> float | None:
    """The peak of a step whose FLOPs run at several precisions: the FLOP-weighted harmonic blend.

    At each precision's peak, F_p FLOPs take F_p / P_p seconds; the whole step's F = sum F_p FLOPs at best take
    the sum of those, so its peak is F / sum(F_p / P_p). An fp8 rung runs the block linears in fp8 and the head
    and attention in bf16: its MFU is taken against this, not against fp8's peak. None if a peak is unknown.
    """
    used = {p: f for p, f in flops.items() if f > 0}
    if not used or any(peaks.get(p) is None for p in used):
        return None
    return sum(used.values()) / sum(f / cast(float, peaks[p]) for p, f in used.items())  # None: returned above


def mfu(tokens_s: float, flops_token: int, peak: float | None) -> float | None:
    """Model FLOPs utilization: achieved useful FLOP/s over the device's peak; None if the peak is unknown."""
    if peak is None:
        return None
    return tokens_s * flops_token / (peak * 1e12)
