"""The device to run on, and what the processor does natively: its vector ISA and whether it has bf16 of its own.

PyTorch dispatches its CPU kernels by the vector ISA it detects (ATEN_CPU_CAPABILITY can force a lower one), and
oneDNN runs bf16 matmuls natively only on AVX-512 BF16 or AMX (ONEDNN_MAX_CPU_ISA can cap it). Elsewhere bf16 is
emulated: every product is converted to fp32 and back, and a bf16 step can run at a tenth of fp32's speed. What is
read here goes into results.json's environment and the run's header, and chooses the dtype of rungs whose own
internals could use bf16 (Muon's Newton-Schulz iteration). A value that cannot be read is "unknown"; nothing stops.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from speedladder.errors import UsageError

# oneDNN ISA names (ONEDNN_MAX_CPU_ISA) at or above which bf16 matmuls run natively (AVX-512 BF16, AMX).
_ONEDNN_BF16 = ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512", "AVX512_CORE_AMX", "AVX10_1_512_AMX",
                "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2", "DEFAULT", "ALL")
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Processor:
    capability: str  # ATen's vector ISA: "AVX512", "AVX2", "DEFAULT", ... or "unknown"
    bf16_native: bool | None  # None: could not be read
    why: str  # one line: what was read

    def to_dict(self) -> dict[str, object]:
        return {"cpu_capability": self.capability, "bf16_native": self.bf16_native, "bf16_why": self.why}


def _probe(name: str) -> bool | None:
    fn = getattr(torch.cpu, name, None) or getattr(torch.cpu, name.lstrip("_"), None)
    try:
        return bool(fn()) if fn is not None else None
    except Exception:  # noqa: BLE001 -- a private probe that changed: unknown, never an error
        return None


def cpu() -> Processor:
    """The CPU's vector ISA and whether bf16 runs natively on it (as torch and oneDNN will use it now)."""
    try:
        capability = str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # noqa: BLE001 -- an old torch or an unusual build: said as unknown
        capability = UNKNOWN
    # torch.cpu's probes read the hardware (cpuinfo); the environment variables cap what torch and oneDNN use.
    hw = [v for v in (_probe("_is_avx512_bf16_supported"), _probe("_is_amx_tile_supported")) if v is not None]
    capped = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if not hw:
        return Processor(capability, None, "this torch cannot tell whether the CPU has bf16 instructions")
    if not any(hw):
        return Processor(capability, False, f"no AVX-512 BF16 or AMX ({capability}): bf16 is emulated in fp32")
    if capped and capped not in _ONEDNN_BF16:
        return Processor(capability, False, f"ONEDNN_MAX_CPU_ISA={capped} caps oneDNN below AVX-512 BF16: bf16 "
                                            "matmuls are emulated")
    if capability not in ("AVX512", UNKNOWN):
        return Processor(capability, False, f"ATEN_CPU_CAPABILITY keeps torch at {capability}: no bf16 kernels")
    return Processor(capability, True, "AVX-512 BF16 or AMX: bf16 matmuls run natively")


def bf16_native(device: torch.device) -> bool:
    """Whether bf16 arithmetic is native on this device: CUDA from compute capability 8.0, MPS yes, a CPU as read."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 0)
    if device.type == "mps":
        return True
    return bool(cpu().bf16_native)


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(requested)
    except RuntimeError:
        raise UsageError(f"unknown device {requested!r} (use auto, cpu, cuda, cuda:N or mps)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"device {requested} asked for, but no CUDA device is available")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(f"device {requested} asked for, but only {torch.cuda.device_count()} CUDA device(s) exist")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError("device mps asked for, but MPS is not available")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise UsageError(f"unsupported device type {dev.type!r} (use cpu, cuda or mps)")
    return dev


def ns_dtype_for(device: torch.device) -> tuple[torch.dtype, str]:
    """The Newton-Schulz iteration's dtype on a device, and the implementation, in words for results.json.

    bf16 where the device runs it natively (tensor cores, AVX-512 BF16 or AMX), as published, through
    torch.optim.Muon where torch has it (it always iterates in bf16). Elsewhere bf16 is emulated and a Muon step
    costs ~10x an AdamW step (seen with oneDNN capped at AVX2: 457 ms against eager's 47 ms on d2l-cpu), so the
    iteration runs in fp32, through the implementation below.
    """
    if bf16_native(device):
        which = "torch.optim.Muon" if hasattr(torch.optim, "Muon") else "speedladder's Muon"
        return torch.bfloat16, f"{which}, Newton-Schulz in bf16 (native here)"
    return torch.float32, "speedladder's Muon, Newton-Schulz in fp32 (bf16 is not native here)"
