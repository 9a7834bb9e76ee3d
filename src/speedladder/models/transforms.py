"""Model transforms on our GPT: each swaps modules of a freshly built model, so the model file stays the reference.

The rungs name them (rungs/builtin.py); a Hugging Face or user family reuses the ones that fit any model
(checkpointing a block, a padded vocabulary's size).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from speedladder.models.gpt import GPT, Attention, Block, attention_heads, merge_heads


class Checkpointed(nn.Module):
    """Runs a block under activation checkpointing: keep its inputs, recompute the rest in backward.

    Any arguments pass through, so a block of any model (a mask, rotary tables, keywords) can be wrapped.
    """

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, *args, **kwargs):
        return checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def checkpoint_blocks(model: GPT) -> GPT:
    model.blocks = nn.ModuleList(Checkpointed(b) for b in model.blocks)
    return model


class SDPAttention(nn.Module):
    """The same causal self-attention through F.scaled_dot_product_attention (Flash / memory-efficient kernels).

    It adopts the hand-written module's qkv and proj layers, so the parameters are the same objects
    under the same names; the (T, T) mask buffer is dropped: is_causal=True says it.
    """

    def __init__(self, attn: Attention) -> None:
        super().__init__()
        self.n_head = attn.n_head
        self.qkv = attn.qkv
        self.proj = attn.proj
        self.qk_norm, self.rotary = attn.qk_norm, attn.rotary  # the speedrun's records, when they came first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = attention_heads(self, x)  # each (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.proj(merge_heads(y))


def use_sdpa(model: GPT) -> GPT:
    for block in cast("Iterable[Block]", model.blocks):  # nn.ModuleList yields nn.Module; a GPT's are Blocks
        block.attn = SDPAttention(block.attn)
    return model


VOCAB_MULTIPLE = 64  # nanoGPT's 50257 -> 50304: the head's matmul dimension becomes a multiple of the tile size


def padded_vocab(vocab_size: int, multiple: int = VOCAB_MULTIPLE) -> int:
    return math.ceil(vocab_size / multiple) * multiple


class PaddedHead(nn.Module):
    """The output head over a padded vocabulary; the padding's logits are -inf, so softmax gives them nothing.

    The loss and the logits of the real vocabulary are those of the unpadded head at the same weights.
    """

    pad: torch.Tensor  # a buffer (register_buffer): declared for the type checker

    def __init__(self, weight: nn.Parameter, vocab_size: int) -> None:
        super().__init__()
        self.weight = weight  # (V_padded, C): the head's own Parameter object, resized
        self.vocab_size = vocab_size
        pad = torch.arange(weight.shape[0], device=weight.device) >= vocab_size
        self.register_buffer("pad", pad, persistent=False)  # (V_padded,) True on the padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight).masked_fill(self.pad, float("-inf"))  # (B, T, V_padded)


def _pad_rows(p: torch.Tensor, rows: int) -> None:
    """Grow a parameter to `rows` rows in place, zeros below: the same Parameter object, so references hold."""
    with torch.no_grad():
        grown = torch.zeros(rows, *p.shape[1:], dtype=p.dtype, device=p.device)
        grown[: p.shape[0]] = p
    p.data = grown


def pad_vocab(model: GPT) -> GPT:
    vocab = model.cfg.vocab_size
    rows = padded_vocab(vocab)
    if rows == vocab:
        return model
    head = cast(nn.Parameter, model.lm_head.weight)  # a Linear's weight; nn.Module types attributes Tensor | Module
    _pad_rows(head, rows)
    if not model.cfg.tie_embeddings:
        _pad_rows(model.wte.weight, rows)
    model.wte.num_embeddings = rows  # ids stay below the real vocabulary: the extra rows are never looked up
    model.lm_head = PaddedHead(head, vocab)
    return model
