"""The vendors' dense peak TFLOP/s by device and precision, and MFU against a peak.

A peak is had one of three ways, and results.json says which (`peak_basis`): given per precision by
--peak-tflops; looked up in the vendors' datasheets below, for a device whose name torch reports exactly as
listed; else measured on the spot as the device's matmul ceiling at that precision (measure/microbench.py), never
guessed from a look-alike name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import cast


@dataclass(frozen=True)
class Datasheet:
    """One device's dense (not sparse) peak TFLOP/s per matmul precision, as its vendor publishes them."""

    model: str  # the device as the notes name it
    names: tuple[str, ...]  # as torch.cuda.get_device_name() spells it; matched word for word (`name_words`)
    capability: tuple[int, int]  # torch.cuda.get_device_capability(): CUDA's compute capability, ROCm's gfx version
    # fp32 (no tensor cores), tf32, bf16, fp16 (accumulating in fp32, as torch's matmuls do) and fp8; a precision
    # the device has no matmul units for is absent, not filled in.
    tflops: dict[str, float]
    source: str  # the document the figures are read from


# The vendors quote the tensor-core figures with 2:4 sparsity (marked *): the dense figures here are half of
# those. GeForce cards run fp16 and bf16 at half rate when accumulating in fp32, as torch's matmuls accumulate:
# their whitepapers give both rates, and the fp32-accumulate one is the one here.
DATASHEETS: tuple[Datasheet, ...] = (
    # Turing: fp16 tensor cores, no bf16, no tf32. "Mixed Precision (FP16/FP32) 65 TFLOPS", FP32 8.1.
    Datasheet("T4", ("Tesla T4",), (7, 5), {"fp32": 8.1, "fp16": 65.0},
              "NVIDIA T4 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/"
              "tesla-t4/t4-tensor-core-datasheet-951643.pdf"),
    # Volta: fp16 tensor cores, no bf16, no tf32. Three boards, three clocks: SXM2 15.7/125, PCIe 14/112, V100S
    # PCIe 16.4/130 (FP32 / Tensor).
    Datasheet("V100 SXM2", ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB"), (7, 0), {"fp32": 15.7, "fp16": 125.0},
              "NVIDIA V100 Tensor Core GPU datasheet, https://images.nvidia.com/content/technologies/volta/pdf/"
              "volta-v100-datasheet-update-us-1165301-r5.pdf"),
    Datasheet("V100 PCIe", ("Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB"), (7, 0), {"fp32": 14.0, "fp16": 112.0},
              "NVIDIA V100 Tensor Core GPU datasheet, https://images.nvidia.com/content/technologies/volta/pdf/"
              "volta-v100-datasheet-update-us-1165301-r5.pdf"),
    Datasheet("V100S PCIe", ("Tesla V100S-PCIE-32GB",), (7, 0), {"fp32": 16.4, "fp16": 130.0},
              "NVIDIA V100 Tensor Core GPU datasheet, https://images.nvidia.com/content/technologies/volta/pdf/"
              "volta-v100-datasheet-update-us-1165301-r5.pdf"),
    # FP32 31.2, TF32 62.5 | 125*, BF16 and FP16 125 | 250*. The A10G (AWS's G5 instances) is another board of
    # the same chip with other clocks and no published datasheet of its own: it is left out, so measured.
    Datasheet("A10", ("NVIDIA A10",), (8, 6), {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
              "NVIDIA A10 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/"
              "a10/pdf/a10-datasheet.pdf"),
    # 40 and 80 GB, SXM4 and PCIe: the datasheet gives one set of figures for all four. FP32 19.5, TF32 156,
    # BF16 and FP16 312 (dense; 312* and 624* with sparsity). No fp8.
    Datasheet("A100", ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB",
                       "NVIDIA A100 80GB PCIe"), (8, 0), {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
              "NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/"
              "a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    # Ada. L4: FP32 30.3, TF32 120*, BF16 and FP16 242*, FP8 485*.
    Datasheet("L4", ("NVIDIA L4",), (8, 9),
              {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5},
              "NVIDIA L4 Tensor Core GPU datasheet, https://resources.nvidia.com/en-us-data-center-overview-mc/"
              "en-us-data-center-overview/l4-gpu-datasheet"),
    # L40: FP32 90.5, TF32 90.5 | 181*, BF16 and FP16 181.05 | 362.1*, FP8 362 | 724*: not the L4's (3x the fp32).
    Datasheet("L40", ("NVIDIA L40",), (8, 9),
              {"fp32": 90.5, "tf32": 90.5, "bf16": 181.05, "fp16": 181.05, "fp8": 362.0},
              "NVIDIA L40 GPU datasheet, https://images.nvidia.com/content/Solutions/data-center/"
              "vgpu-L40-datasheet.pdf"),
    # L40S: FP32 91.6, TF32 183 | 366*, BF16 and FP16 362.05 | 733*, FP8 733 | 1,466*.
    Datasheet("L40S", ("NVIDIA L40S",), (8, 9),
              {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0},
              "NVIDIA L40S GPU datasheet, https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"),
    # Hopper. The architecture whitepaper's H100 SXM5 and PCIe columns (dense, at boost clock); the datasheet
    # rounds them (SXM: FP32 67, TF32 989*, BF16 1,979*, FP8 3,958*; PCIe: FP32 51, TF32 756*, BF16 1,513*, FP8
    # 3,026*). The SXM board reports its memory ("NVIDIA H100 80GB HBM3"), the others their form.
    Datasheet("H100 SXM", ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB"), (9, 0),
              {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
              "NVIDIA H100 Tensor Core GPU Architecture whitepaper, https://resources.nvidia.com/en-us-tensor-core/"
              "gtc22-whitepaper-hopper"),
    Datasheet("H100 PCIe", ("NVIDIA H100 PCIe",), (9, 0),
              {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0},
              "NVIDIA H100 Tensor Core GPU Architecture whitepaper, https://resources.nvidia.com/en-us-tensor-core/"
              "gtc22-whitepaper-hopper"),
    # H100 NVL, per GPU: FP32 60, TF32 835*, BF16 and FP16 1,671*, FP8 3,341*.
    Datasheet("H100 NVL", ("NVIDIA H100 NVL",), (9, 0),
              {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
              "NVIDIA H100 Tensor Core GPU datasheet, https://resources.nvidia.com/en-us-tensor-core/"
              "nvidia-tensor-core-gpu-datasheet"),
    # H200 SXM: the H100 SXM5's chip and clocks with more memory; its datasheet gives FP32 67, TF32 989*, BF16
    # and FP16 1,979*, FP8 3,958*, the H100 SXM's rounded, whose whitepaper figures are kept. H200 NVL: the H100
    # NVL's, FP32 60, TF32 835*, BF16 and FP16 1,671*, FP8 3,341*.
    Datasheet("H200 SXM", ("NVIDIA H200",), (9, 0),
              {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
              "NVIDIA H200 Tensor Core GPU datasheet, https://nvdam.widen.net/s/nb5zzzsjdf/"
              "hpc-datasheet-sc23-h200-datasheet-3002446"),
    Datasheet("H200 NVL", ("NVIDIA H200 NVL",), (9, 0),
              {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
              "NVIDIA H200 Tensor Core GPU datasheet, https://nvdam.widen.net/s/nb5zzzsjdf/"
              "hpc-datasheet-sc23-h200-datasheet-3002446"),
    # Blackwell, the HGX B200 column, per GPU: FP32 75, TF32 2.2 P*, BF16 and FP16 4.5 P*, FP8 9 P*.
    Datasheet("B200", ("NVIDIA B200",), (10, 0),
              {"fp32": 75.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
              "NVIDIA Blackwell datasheet (HGX B200), https://nvdam.widen.net/s/wwnsxrhm2w/"
              "blackwell-datasheet-3384703"),
    # GeForce, from each architecture whitepaper's appendix (dense | sparse, fp32 accumulate). RTX 3090: FP32
    # 35.6, TF32 35.6 | 71, BF16 and FP16 71 | 142 (FP16 with fp16 accumulate: 142 | 284). No fp8.
    Datasheet("RTX 3090", ("NVIDIA GeForce RTX 3090",), (8, 6),
              {"fp32": 35.6, "tf32": 35.6, "bf16": 71.0, "fp16": 71.0},
              "NVIDIA Ampere GA102 GPU Architecture whitepaper, appendix A, https://www.nvidia.com/content/PDF/"
              "nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"),
    # RTX 4090: FP32 82.6, TF32 82.6 | 165.2, BF16 and FP16 165.2 | 330.4, FP8 330.3 | 660.6.
    Datasheet("RTX 4090", ("NVIDIA GeForce RTX 4090",), (8, 9),
              {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2, "fp8": 330.3},
              "NVIDIA Ada GPU Architecture whitepaper, appendix A, https://images.nvidia.com/aem-dam/Solutions/geforce/"
              "ada/nvidia-ada-gpu-architecture.pdf"),
    # RTX 5090: FP32 104.8, TF32 104.8 | 209.5, BF16 and FP16 209.5 | 419, FP8 419 | 838.
    Datasheet("RTX 5090", ("NVIDIA GeForce RTX 5090",), (12, 0),
              {"fp32": 104.8, "tf32": 104.8, "bf16": 209.5, "fp16": 209.5, "fp8": 419.0},
              "NVIDIA RTX Blackwell GPU Architecture whitepaper, appendix, https://images.nvidia.com/aem-dam/Solutions/"
              "geforce/blackwell/nvidia-rtx-blackwell-gpu-architecture.pdf"),
    # ROCm reports an AMD GPU through torch.cuda, with its gfx version (gfx942: 9.4) as the capability; a
    # virtual function (VF) of the chip is the chip. FP32 163.4 (vector and matrix), TF32 653.7, BF16 and FP16
    # 1,307.4, FP8 2,614.9 (dense; twice with sparsity).
    Datasheet("MI300X", ("AMD Instinct MI300X", "AMD Instinct MI300X VF"), (9, 4),
              {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
              "AMD Instinct MI300X data sheet, https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/"
              "data-sheets/amd-instinct-mi300x-data-sheet.pdf"),
)

# Words of a device name that name no device: the vendor and its product lines.
_LINE_WORDS = frozenset({"NVIDIA", "TESLA", "GEFORCE", "AMD", "INSTINCT"})


def name_words(device_name: str) -> frozenset[str]:
    """The words that tell one device from another: upper-cased, split at spaces, hyphens and underscores, less
    the vendor's and its lines' names and a memory size ("40GB": one board's peaks hold for each of its sizes).

    "NVIDIA A100-SXM4-80GB" -> {A100, SXM4}; "NVIDIA GeForce RTX 4090 D" -> {RTX, 4090, D}, which is not the
    RTX 4090's {RTX, 4090}; "NVIDIA L40" -> {L40}, not the L4's {L4}.
    """
    return frozenset(w for w in re.split(r"[\s\-_]+", device_name.upper())
                     if w and w not in _LINE_WORDS and not re.fullmatch(r"\d+GB", w))


def datasheet(device_name: str, capability: tuple[int, int] | None = None) -> Datasheet | None:
    """The datasheet of a device: one whose listed name has the same words, and the same capability where one is
    given (a name that some other chip also reported would not pass it). None for a device not in the table."""
    words = name_words(device_name)
    for sheet in DATASHEETS:
        if any(name_words(n) == words for n in sheet.names) and capability in (None, sheet.capability):
            return sheet
    return None


def device_model(device_name: str, capability: tuple[int, int] | None = None) -> str | None:
    """The model a device name is in the table as ("H100 SXM", "A100", ...); None for a device not in it."""
    sheet = datasheet(device_name, capability)
    return sheet.model if sheet else None


def peak_tflops(device_name: str, precision: str, capability: tuple[int, int] | None = None) -> float | None:
    """A device's datasheet peak at a precision; None if the device is not in the table or lacks the precision."""
    sheet = datasheet(device_name, capability)
    return sheet.tflops.get(precision) if sheet else None


@dataclass(frozen=True)
class Peak:
    """The peak TFLOP/s an MFU is taken against, and how it was had (results.json's `peak_basis`)."""

    tflops: float
    basis: str


GIVEN = "peak given by --peak-tflops"
MEASURED = "measured peak"  # how a peak_basis begins where the peak was measured here: the MFU is marked so


def known_peak(given: dict[str, float] | None, device_name: str, device_type: str,
               capability: tuple[int, int] | None, precision: str) -> Peak | None:
    """The peak known without measuring: --peak-tflops's for this precision, else the datasheet's for a CUDA or
    ROCm device in the table. None where neither has it: the caller measures this device's ceiling instead."""
    if given and precision in given:
        return Peak(given[precision], GIVEN)
    sheet = datasheet(device_name, capability) if device_type == "cuda" else None
    if sheet is not None and precision in sheet.tflops:
        return Peak(sheet.tflops[precision], f"datasheet peak of the {sheet.model}")
    return None


def measured_peak(tflops: float, side: int) -> Peak:
    """A peak measured here: an n x n x n matmul's throughput at the rung's precision (measure/microbench.py)."""
    return Peak(tflops, f"{MEASURED}, a {side}×{side}×{side} matmul's throughput on this device, which the "
                        "datasheet table does not list at this precision")


def is_measured(basis: str) -> bool:
    """Whether a peak_basis names a peak measured here (an fp8 blend of which either part was measured too)."""
    return MEASURED in basis


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
