"""What is asked of the device outside the timed work: its queue drained at a window's edge, its memory peaks, and
the host allocator's free memory handed back between measurements."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

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


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> int | None:
    """Peak bytes allocated on the device; None where the device does not report it (CPU, MPS)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return None


def peak_reserved(device: torch.device) -> int | None:
    """Peak bytes the CUDA allocator reserved: CUDA graphs' private pools are reserved whole, and what their
    replays use is never allocated again, so the allocated peak can miss it. None off CUDA."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_reserved(device))
    return None
