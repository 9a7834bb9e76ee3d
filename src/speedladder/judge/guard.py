"""What a candidate may not touch, watched from inside its worker (docs/judge.md#what-the-referee-catches).

Installed before the candidate's file is imported, and read after its build, its gates and every seed:

- the functions it may not replace: every callable of the clock (`time`), of torch's namespace, its functional
  API and its tensor and module classes, and of every speedladder module loaded (with their classes' methods),
  compared by identity with what they were before the candidate came;
- the numeric state it may not change: float32 matmul precision, TF32 and reduced-precision reductions, the
  default dtype, autocast and grad mode, as they stand between two requests;
- the data it may not read: an audit hook (which Python code cannot remove) refuses, and records, any open of the
  corpus files, the val file or the referee's own process under /proc.

The clock, the data and the evaluation are the referee's, in another process, whatever happens here: the guard
is what names an attempt, so that a loop learns which candidate tried.
"""

from __future__ import annotations

import inspect
import os
import sys
import types
from collections.abc import Callable, Iterator

import torch

DATA_REFUSED = "speedladder judge: the data belongs to the referee"  # the error a refused open raises
WATCHED = ("time", "torch", "torch.nn.functional", "torch.autograd", "torch.cuda", "math")
CLASSES = (torch.Tensor, torch.nn.Module)


def _callables(owner: object) -> Iterator[tuple[str, object]]:
    """(name, object) of every function, builtin or class an owner (a module or a class) holds by name."""
    for name, obj in list(vars(owner).items()):
        if (callable(obj) or isinstance(obj, (staticmethod, classmethod, property))) and not isinstance(
                obj, types.ModuleType):
            yield name, obj


def _watched_owners() -> Iterator[tuple[str, object]]:
    for name in WATCHED:
        if name in sys.modules:
            yield name, sys.modules[name]
    for cls in CLASSES:
        yield f"{cls.__module__}.{cls.__qualname__}", cls
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "speedladder" or name.startswith("speedladder.")):
            continue
        yield name, module
        for cname, cls in list(vars(module).items()):
            if inspect.isclass(cls) and cls.__module__ == name:
                yield f"{name}.{cname}", cls


def snapshot() -> dict[str, object]:
    """Every watched callable by its dotted name; the objects themselves are kept, so an identity is never reused."""
    return {f"{owner}.{name}": obj for owner, where in _watched_owners() for name, obj in _callables(where)}


def numeric_state() -> dict[str, object]:
    """The process-wide numeric settings a lower-precision trick would change."""
    m = torch.backends.cuda.matmul
    return {"torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
            "torch.backends.cuda.matmul.allow_tf32": m.allow_tf32,
            "torch.backends.cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction":
                m.allow_bf16_reduced_precision_reduction,
            "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction":
                m.allow_fp16_reduced_precision_reduction,
            "torch.get_default_dtype()": str(torch.get_default_dtype()),
            "torch.is_autocast_enabled('cpu')": torch.is_autocast_enabled("cpu"),
            "torch.is_grad_enabled()": torch.is_grad_enabled()}


def _torch_own_patches() -> None:
    """What torch replaces in its own namespace on first use, done now, before the snapshot: importing dynamo wraps
    torch.manual_seed; the first compile tags nn.Module.__init__ and __setstate__ (dynamo's mutation tracker)."""
    import torch._dynamo  # noqa: F401 -- imported for what its import does

    try:
        from torch._dynamo.mutation_guard import install_generation_tagging_init
    except ImportError:  # another torch: its first compile may then be named, never missed
        return
    install_generation_tagging_init()


class Guard:
    """The watch over one worker: what stood before the candidate came, and what it tried since."""

    def __init__(self, protected: list[str]) -> None:
        _torch_own_patches()
        self.before = snapshot()
        self.state = numeric_state()
        self.protected = [os.path.realpath(p) for p in protected]
        self.opened: list[str] = []
        self._inside = False
        sys.addaudithook(self._audit)  # for the rest of the process: Python code cannot remove a hook

    def _is_protected(self, path: str) -> bool:
        real = os.path.realpath(path)
        return any(real == p or real.startswith(p.rstrip(os.sep) + os.sep) for p in self.protected)

    def _audit(self, event: str, args: tuple) -> None:
        if event != "open" or self._inside or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        self._inside = True  # realpath's own calls raise no open event, but a hook must never recurse
        try:
            path = os.fsdecode(args[0])
            hit = self._is_protected(path)
        finally:
            self._inside = False
        if hit:
            self.opened.append(path)
            raise PermissionError(f"{DATA_REFUSED}: {path}")

    def problems(self) -> list[str]:
        """What the candidate did that it may not, one line each: data opened, functions replaced, state changed."""
        out = [f"opened the data ({os.path.basename(p)})" for p in dict.fromkeys(self.opened)]
        now = snapshot()
        out += [f"replaced {name}" for name, obj in self.before.items() if now.get(name) is not obj]
        state = numeric_state()
        out += [f"set {k} to {state[k]!r} (it was {v!r})" for k, v in self.state.items() if state[k] != v]
        return out


def watched_call(problems: Callable[[], list[str]]) -> list[str]:
    """The guard's lines, or the reason it could not be read (a candidate that broke the process's state)."""
    try:
        return problems()
    except Exception as e:  # noqa: BLE001 -- a guard that cannot read is itself a finding
        return [f"broke the guard's reading ({type(e).__name__}: {e})"]
