"""A nanoGPT-style model for the gate benchmarks (bench/gates.py): written here in this project's words, with
nanoGPT's shape of things: GPTConfig-like sizes, exact-erf GELU in the MLP, pre-LayerNorm blocks with biases, a
causal mask kept as a float buffer and compared with 0, tied embeddings, forward(idx, targets) -> (logits, loss)."""

import math

import torch
import torch.nn.functional as F
from torch import nn

WIDTH, HEADS, LAYERS = 128, 4, 2


class Attention(nn.Module):
    def __init__(self, block_size: int) -> None:
        super().__init__()
        self.c_attn = nn.Linear(WIDTH, 3 * WIDTH)
        self.c_proj = nn.Linear(WIDTH, WIDTH)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = F.softmax(att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf")), dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, block_size: int) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = Attention(block_size)
        self.c_fc, self.gelu, self.c_proj = nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(self.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, WIDTH), nn.Embedding(block_size, WIDTH)
        self.h = nn.ModuleList(Block(block_size) for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # tied, as nanoGPT's

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits[:, [-1], :], None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
