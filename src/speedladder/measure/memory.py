"""Memory on every device, measured and never invented: saved activations, the step's peak, a prediction.

Three figures per rung (docs/memory-sweep.md):

- saved_activation_bytes: what autograd keeps from the forward for the
  backward, counted with torch.autograd.graph.saved_tensors_hooks during one
  forward of the rung's own step (compiled or not, checkpointed or not), on
  any device. Every saved tensor is counted by its storage, once: a view shares
  its base's storage, so q, k and v split from one projection count as that
  projection. The model's own state (parameters and buffers) is not an
  activation: it is held whether or not a step runs, so a saved tensor whose
  storage is a parameter's or a buffer's is left out. A bf16 copy of a weight
  made by autocast is counted: it exists only for this step.
- the step's peak: on CUDA the allocator's peak over what the process held at its reset (devicemem). On a
  CPU, a child process builds each rung's step in turn (one process for the
  rungs of a run, each step dropped before the next is built), runs `warmup`
  steps, then reads its resident set (VmRSS), resets the kernel's resident
  high-water mark (/proc/self/clear_refs, "5") and runs `steps` more: the
  high-water mark (VmHWM) less the resident set before is what this rung's
  step adds on top of what the process holds between steps (weights, optimizer
  state, compiled code, what earlier rungs left behind). The
  child's glibc gets a fixed mmap threshold (MALLOC_MMAP_THRESHOLD_), so a
  freed tensor goes back to the system and the resident set follows the live
  tensors instead of the allocator's free lists.
- predicted_activation_bytes: eager autograd's saves written out from the
  shapes, set beside the measurement.

This module holds the meters themselves, on any callable and any process (torch alone); ladder/rung_memory.py
applies them to a rung of the ladder: its step, its prediction, and the child process that runs the steps.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from speedladder.measure import devicemem


@dataclass(frozen=True)
class Saved:
    """What one forward saved for backward, each storage counted once."""

    activation_bytes: int  # storages that are not the model's state
    state_bytes: int  # parameters and buffers saved by reference (not activations: held anyway)
    tensors: int  # distinct activation storages


def _key(t: torch.Tensor) -> tuple[str, int]:
    return str(t.device), t.untyped_storage().data_ptr()


def count_saved(forward: Callable[[], object], state: Iterable[torch.Tensor]) -> Saved:
    """Run `forward` under saved-tensor hooks and count what autograd saves, by storage.

    `state`: the tensors that are the model's own (parameters, buffers); a saved
    tensor sharing one's storage is counted apart, as state. The output of
    `forward` is dropped, and with it the graph and everything it saved: the hook keeps a detached view of each
    saved tensor, never the tensor itself, whose grad_fn may be the node that saved it (a cycle through autograd's
    C++ that gc cannot break, so a forward without its backward leaked its whole graph, rung after rung).
    """
    own = {_key(t) for t in state}
    acts: dict[tuple[str, int], int] = {}
    kept: dict[tuple[str, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        nbytes = t.untyped_storage().nbytes()
        if nbytes:  # an empty placeholder (torch 2.11's checkpoint saves one) holds no memory: not counted
            key = _key(t)
            (kept if key in own else acts)[key] = nbytes
        return t.detach()  # its storage kept alive (a freed one's address could be reused and miscounted)

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    del out
    return Saved(sum(acts.values()), sum(kept.values()), len(acts))


# -- the step's resident peak, in a child process ----------------------------------------------

MMAP_THRESHOLD = 64 << 10  # bytes: every allocation at least this large gets its own mapping, returned on free


def _status_bytes(key: str) -> int:
    m = re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    if m is None:
        raise RuntimeError(f"/proc/self/status has no {key}")
    return int(m.group(1)) * 1024


def process_peak_unsupported() -> str | None:
    """Why the resident peak cannot be measured here, or None (Linux: VmHWM that clear_refs can reset)."""
    if not Path("/proc/self/clear_refs").exists() or not Path("/proc/self/status").exists():
        return "resident peak not measured: no /proc/self/clear_refs (Linux only) to reset it per rung"
    return None


def resident_peak(step: Callable[[], object], warmup: int, steps: int) -> dict[str, int]:
    """Warm up, then the resident set before `steps` steps and its high-water mark while they ran."""
    for _ in range(warmup):
        step()
    # glibc hands freed heap pages back, so "before" is what is live (the child's fixed mmap threshold returns
    # large blocks on free anyway).
    devicemem.return_host_memory()
    base = _status_bytes("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
    for _ in range(steps):
        step()
    return {"process_base_bytes": base, "process_peak_bytes": _status_bytes("VmHWM")}
