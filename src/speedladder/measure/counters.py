"""The compiler's counters, read in one place (they are private): graphs compiled, graphs served from a cache,
CUDA graphs recorded, graph breaks, and the kernels its generated code calls."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path


def compile_count() -> int:
    """Graphs compiled so far in this process (dynamo's own counter; private, so read in one place)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def compile_cache_hits() -> int:
    """Compiled graphs served from inductor's and AOTAutograd's caches (on disk across runs): a warm compile."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"])


@contextlib.contextmanager
def graph_recordings() -> Iterator[Callable[[], int]]:
    """While open, counts the CUDA graphs that cudagraph trees record (at run time, after the compile).

    Dynamo runs its compile callbacks with the trigger CUDAGRAPH_RECORDING around each recording (private API,
    read in this one place; torch.compiler.reset() clears the callbacks, so one is registered per use). Where
    torch has no such trigger, nothing is counted.
    """
    from torch._dynamo import callback

    count = [0]
    trigger = getattr(getattr(callback, "CallbackTrigger", None), "CUDAGRAPH_RECORDING", None)

    def on_start(event: object) -> None:
        if trigger is not None and getattr(event, "callback_trigger", None) is trigger:
            count[0] += 1

    handler = callback.callback_handler
    handler.register_start_callback(on_start)
    try:
        yield lambda: count[0]
    finally:
        if on_start in handler.start_callbacks:
            handler.remove_start_callback(on_start)


def graph_breaks() -> dict[str, int]:
    """The graph breaks dynamo has counted in this process, by reason (its own counter; cleared by clear())."""
    from torch._dynamo.utils import counters

    return {str(reason): int(n) for reason, n in counters["graph_break"].items()}


def clear() -> None:
    """Every dynamo counter back to zero: what follows is counted alone."""
    from torch._dynamo.utils import counters

    counters.clear()


def compiled_modules() -> int:
    """How many generated modules inductor has loaded in this process so far (compiled, or read from its cache)."""
    from torch._inductor.codecache import PyCodeCache

    return len(PyCodeCache.modules)


# A kernel call in a generated module's `call`: a fused kernel of inductor's own (C++ loops on a CPU, Triton on a GPU),
# or a call into a library (a matmul's extern kernel, an aten op it falls back to).
_CALL = re.compile(r"^\s+(?:[\w, ]+ = )?(cpp_fused_\w+|triton_\w+\.run|extern_kernels\.\w+|torch\.ops\.[\w.]+)\(",
                   re.MULTILINE)


def kernel_calls(since: int) -> dict[str, int] | None:
    """The kernel calls in the `call` function of every module inductor loaded after the first `since`: each graph's
    calls, run once a step, as {"fused": inductor's own kernels, "library": extern and fallback calls}. None when no
    module was loaded since (nothing compiled, or the generated code cannot be read)."""
    from torch._inductor.codecache import PyCodeCache

    fused = library = 0
    modules = list(PyCodeCache.modules)[since:]
    for module in modules:
        try:
            source = Path(module.__file__ or "").read_text()
        except OSError:
            return None
        for name in _CALL.findall(_call_body(source)):
            if name.startswith(("cpp_fused_", "triton_")):
                fused += 1
            else:
                library += 1
    return {"fused": fused, "library": library} if modules else None


def _call_body(source: str) -> str:
    """The body of a generated module's `call` (a function, or a method of its runner class): the lines after its
    `def` more indented than it."""
    lines = source.splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("def call(")), None)
    if start is None:
        return ""
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = []
    for line in lines[start + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        body.append(line)
    return "\n".join(body)
