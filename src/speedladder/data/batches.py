"""Batches of one fixed shape: the training stream and the fixed val windows."""

from __future__ import annotations

from typing import TypedDict

import numpy as np
import torch

from speedladder.data.corpus import Corpus, check_fits, unmap


def val_windows(val: Corpus, seq_len: int, sequences: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed val set: `sequences` windows of T tokens (and their next tokens), evenly spaced over the val split,
    the same for every configuration and seed; (N, T) int64 on the host. Fewer when the split holds fewer."""
    last = val.n_tokens - seq_len - 1  # the last start that leaves room for the shifted targets
    n = max(1, min(sequences, last + 1))
    starts = torch.linspace(0, last, n).round().long()
    index = starts[:, None] + torch.arange(seq_len + 1)  # (N, T+1)
    if isinstance(val.tokens, torch.Tensor):
        chunk = val.tokens[index]
    else:
        chunk = torch.from_numpy(val.tokens[index.numpy()].astype(np.int64))
        unmap(val.tokens)
    return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()

class StreamState(TypedDict):
    """Where a BatchStream stands (plain data: a checkpoint holds it)."""

    generator: torch.Tensor  # the offsets' generator state
    drawn: int  # batches drawn so far


class BatchStream:
    """Endless stream of (x, y) batches of one fixed shape (B, T), y = x shifted by one.

    Each batch is B windows at random offsets drawn from a seeded generator, so
    the same seed gives the same batches on any device, and no batch is ragged.
    On CUDA the batch goes through pinned host memory with a non-blocking copy;
    that copy is part of every timed step.
    """

    def __init__(self, corpus: Corpus, batch_size: int, seq_len: int, device: torch.device,
                 seed: int) -> None:
        check_fits(corpus, batch_size, seq_len)
        self.tokens = corpus.tokens
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.device = device
        self._gen = torch.Generator().manual_seed(seed)
        self._span = torch.arange(seq_len + 1)  # (T+1,)
        self._pin = device.type == "cuda"
        self.drawn = 0  # batches drawn so far

    def state(self) -> StreamState:
        """Where the stream stands: its generator's state and the batches drawn; `load_state` goes back there."""
        return {"generator": self._gen.get_state(), "drawn": self.drawn}

    def load_state(self, state: StreamState) -> None:
        """Continue from a `state()`: the next batch is the one that followed it."""
        self._gen.set_state(state["generator"])
        self.drawn = state["drawn"]

    def next_host(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch on the host, before any copy."""
        self.drawn += 1
        starts = torch.randint(len(self.tokens) - self.seq_len, (self.batch_size,), generator=self._gen)
        index = starts[:, None] + self._span  # (B, T+1)
        if isinstance(self.tokens, torch.Tensor):
            chunk = self.tokens[index]  # one gather, no Python loop
        else:  # a gather from the memory map: only the pages of these B windows are read
            chunk = torch.from_numpy(self.tokens[index.numpy()].astype(np.int64))
            unmap(self.tokens)
        return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.next_host()
        if self._pin:
            # The caching host allocator keeps a pinned block until its copy has run, so no race.
            x, y = x.pin_memory(), y.pin_memory()
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
