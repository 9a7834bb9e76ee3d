"""The compiler's counters, read in one place (they are private): graphs compiled, graphs served from a cache, and
CUDA graphs recorded."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


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
