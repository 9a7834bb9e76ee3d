"""What is asked of the device outside the timed work: its queue drained at a window's edge, its memory peaks, and
the host allocator's free memory handed back between measurements."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

import torch


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc; None on other C libraries
    except OSError:
        return None


_TRIM = _malloc_trim()


def return_host_memory() -> None:
    """Hand the host allocator's free memory back to the system (glibc's malloc_trim), outside timed work only.

    glibc keeps what a step frees (a logits tensor of tens of MB is freed every step) on its free lists: over a
    few hundred untimed steps (the learns-check) the resident set grew by GBs on a 1B-token file with a 50k
    vocabulary, memory nothing used. Never called inside or between timed windows: memory handed back is
    faulted in again by the next step, which would then be timed paying for it. No gc.collect here: a step's
    tensors are freed by reference counting, and a full collection costs ~15 ms, which every fifth step of a
    curve would pay.
    """
    if _TRIM is not None:
        _TRIM(0)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work: only ever at a window's edge."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


@dataclass(frozen=True)
class Held:
    """What the process held on the device when its peaks were reset (the gates' references, the last rung's
    leftovers): a peak read afterwards is measured over it, so that it belongs to the work since the reset."""

    allocated: int
    reserved: int


def reset_peak_memory(device: torch.device) -> Held | None:
    """Reset the device's peaks and say what the process holds now; None where the device reports no peaks."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return Held(int(torch.cuda.memory_allocated(device)), int(torch.cuda.memory_reserved(device)))
    return None


def peak_memory(device: torch.device, held: Held | None = None) -> int | None:
    """Peak bytes allocated on the device since the reset, less what was allocated at it (`held`): what the work
    since the reset added at its peak (an understatement only if the work freed some of what was held). None
    where the device does not report it (CPU, MPS)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)) - (held.allocated if held is not None else 0)
    return None


def peak_reserved(device: torch.device, held: Held | None = None) -> int | None:
    """Peak bytes the CUDA allocator reserved since the reset, less what it had reserved at it: CUDA graphs'
    private pools are reserved whole, and what their replays use is never allocated again, so the allocated peak
    can miss it. None off CUDA."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_reserved(device)) - (held.reserved if held is not None else 0)
    return None
