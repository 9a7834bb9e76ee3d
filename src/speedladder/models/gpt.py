"""The GPT: one decoder-only transformer and its config (named sizes live in presets.PRESETS).

Nothing here times, logs or distributes. Speed techniques are applied from the
outside (see rungs.py), so the function this file defines is the reference.
Attention is written out by hand, as in the source texts; fused attention is a
later rung, not a property of the model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    """Architecture of a pre-LayerNorm decoder-only transformer."""

    vocab_size: int
    block_size: int  # longest sequence the learned position table covers
    n_layer: int
    n_head: int
    n_embd: int
    mlp_hidden: int
    bias: bool = True  # biases in Linear and LayerNorm layers
    tie_embeddings: bool = False  # output head shares the token-embedding matrix
    activation: str = "gelu"  # "gelu" (GPT-2, tanh form) or "relu" (d2l's position-wise FFN)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "mlp_hidden"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.activation not in ("gelu", "relu"):
            raise ValueError(f"activation must be 'gelu' or 'relu', got {self.activation!r}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


class Rotary(nn.Module):
    """Rotary position embeddings (Su et al. 2021, RoFormer): each pair of a head's channels rotated by an angle
    proportional to the position, so q.k depends on the positions' difference alone."""

    cos: torch.Tensor  # buffers (register_buffer): declared for the type checker
    sin: torch.Tensor

    def __init__(self, head_dim: int, block_size: int, base: float = 10000.0) -> None:
        super().__init__()
        inv = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # (hs/2,)
        angles = torch.outer(torch.arange(block_size, dtype=torch.float32), inv)  # (block_size, hs/2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, nh, T, hs)
        T = x.shape[-2]
        cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        a, b = x[..., 0::2], x[..., 1::2]  # each (B, nh, T, hs/2)
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


class Attention(Protocol):
    """What attention_heads reads of an attention module, and a Block holds: CausalSelfAttention, or the
    fused-attention rung's SDPAttention, which adopts its layers and settings."""

    n_head: int
    qkv: nn.Linear
    proj: nn.Linear
    qk_norm: bool
    rotary: Rotary | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class CausalSelfAttention(nn.Module):
    causal_mask: torch.Tensor  # a buffer (register_buffer): declared for the type checker

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        mask = torch.tril(torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool))
        # Not a parameter and not saved: it is a function of block_size alone.
        self.register_buffer("causal_mask", mask.view(1, 1, cfg.block_size, cfg.block_size),
                             persistent=False)
        self.qk_norm = False  # the speedrun's QK-norm (GPT.speedladder_qk_norm)
        self.rotary: Rotary | None = None  # rotary positions instead of the learned table (speedladder_rotary)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        q, k, v = attention_heads(self, x)  # each (B, nh, T, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, T)
        att = att.masked_fill(~self.causal_mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v  # (B, nh, T, hs)
        return self.proj(merge_heads(y))


def split_heads(qkv: torch.Tensor, n_head: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T, 3C) projections -> q, k, v, each (B, nh, T, hs); shared with the fused-attention rung."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    return tuple(t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in qkv.split(C, dim=2))


def attention_heads(attn: Attention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of an attention module (its qkv layer, heads, and the speedrun's QK-norm and rotary positions when
    set), each (B, nh, T, hs); shared with the fused-attention rung, which adopts the same settings."""
    q, k, v = split_heads(attn.qkv(x), attn.n_head)
    if attn.qk_norm:  # RMS-normalized per head, no learned scale, as the speedrun's record has it
        q, k = F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))
    if attn.rotary is not None:
        q, k = attn.rotary(q), attn.rotary(k)
    return q, k, v


def merge_heads(y: torch.Tensor) -> torch.Tensor:
    """(B, nh, T, hs) -> (B, T, C)."""
    B, nh, T, hs = y.shape
    return y.transpose(1, 2).contiguous().view(B, T, nh * hs)


class ReLUSquared(nn.Module):
    """ReLU(x)^2 (So et al. 2021, Primer): the speedrun's MLP activation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x).square()


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, cfg.mlp_hidden, bias=cfg.bias)
        self.act: nn.Module = nn.GELU(approximate="tanh") if cfg.activation == "gelu" else nn.ReLU()
        self.proj = nn.Linear(cfg.mlp_hidden, cfg.n_embd, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    """Pre-LN block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn: Attention = CausalSelfAttention(cfg)  # SDPAttention once the sdpa rung ran
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head: nn.Module = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)  # PaddedHead after pad-vocab
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight  # GPT-2 ties input and output embeddings
        self.positions = True  # the learned position table; off once rotary positions replace it
        self.softcap: float | None = None  # logits soft-capped at +-softcap (speedladder_softcap)
        self.apply(self._init_weights)
        # GPT-2's scaled init of the projections that write into the residual stream.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    # -- the speedrun's model records, as hooks (rungs/speedrun.py calls them; a user's model may define the same).
    # Each changes the function in place, on a freshly built model, keeping every parameter object.

    def speedladder_qk_norm(self) -> None:
        """QK-norm: queries and keys RMS-normalized per head before their dot product."""
        for block in cast("Iterable[Block]", self.blocks):  # nn.ModuleList yields nn.Module; these are Blocks
            block.attn.qk_norm = True

    def speedladder_relu2(self) -> None:
        """ReLU^2 as the MLP's activation."""
        for block in cast("Iterable[Block]", self.blocks):  # nn.ModuleList yields nn.Module; these are Blocks
            block.mlp.act = ReLUSquared()

    def speedladder_rotary(self) -> None:
        """Rotary positions in every attention; the learned position table is no longer added (its rows get no
        gradient)."""
        for block in cast("Iterable[Block]", self.blocks):  # nn.ModuleList yields nn.Module; these are Blocks
            block.attn.rotary = Rotary(self.cfg.head_dim, self.cfg.block_size).to(self.wte.weight.device)
        self.positions = False

    def speedladder_softcap(self, cap: float) -> None:
        """Logits soft-capped: cap * tanh(logits / cap) (Gemma 2), computed in fp32."""
        self.softcap = cap

    def num_params(self) -> int:
        """Every parameter once (a tied matrix counts once), position table included."""
        return sum(p.numel() for p in self.parameters())

    def matmul_params(self) -> int:
        """Parameters that take part in matrix products: N of the 6N FLOP rule.

        Embedding lookups do no arithmetic, so the position table and an untied
        token table are left out; a tied token table is kept, as it is the head.
        """
        n = self.num_params() - self.wpe.weight.numel()
        if not self.cfg.tie_embeddings:
            n -= self.wte.weight.numel()
        return n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        T = idx.shape[1]
        if T > self.cfg.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.cfg.block_size}")
        x = self.wte(idx)  # (B, T, C)
        if self.positions:
            x = x + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        if self.softcap is not None:
            wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
            logits = self.softcap * torch.tanh(wide / self.softcap)
            pad = getattr(self.lm_head, "pad", None)  # a padded head's columns stay at -inf (tanh would lift them)
            if pad is not None:
                logits = logits.masked_fill(pad, float("-inf"))
        loss = None
        if targets is not None:
            # In fp32 at least whatever the autocast dtype: the softmax over the vocabulary is where bf16 loses
            # (fp64 stays fp64: the gates' reference).
            wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
            loss = F.cross_entropy(wide.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, new_tokens: int, temperature: float, top_k: int,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Extend idx (B, T) by new_tokens sampled one at a time; top_k 0 samples from the whole vocabulary."""
        for _ in range(new_tokens):
            logits, _ = self(idx[:, -self.cfg.block_size:])
            idx = torch.cat([idx, sample_next(logits[:, -1, :], temperature, top_k, generator)], dim=1)
        return idx


def sample_next(logits: torch.Tensor, temperature: float, top_k: int,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of the last position's logits (B, V): (B, 1); top_k 0 samples from the whole vocabulary."""
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)  # (B, 1)
