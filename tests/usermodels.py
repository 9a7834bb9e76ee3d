"""Small language models written as a user would write them, one file each, for the tests of `--model`.

They share one trunk (embeddings, an nn.ModuleList of blocks, a head) and differ in what a user's model
differs in: the forward convention, how it is built, and dropout. Each is written to a file of its own.
The three that climb the default ladder compute the same operations as each other (the nanoGPT one
computes the loss as speedladder does for the others) and, at the tiny preset's sizes, as the bundled GPT,
so compiled code is shared through inductor's cache with each other and with tests/ladder/test_ladder.py's climb.
"""

from __future__ import annotations

from pathlib import Path

TRUNK = '''
import math

import torch
import torch.nn.functional as F
from torch import nn

WIDTH, HEADS, LAYERS, HIDDEN = 32, 2, 2, 64


class Block(nn.Module):
    def __init__(self, block_size, p):
        super().__init__()
        self.ln_1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.ln_2 = nn.LayerNorm(WIDTH)
        self.fc = nn.Linear(WIDTH, HIDDEN)
        self.out = nn.Linear(HIDDEN, WIDTH)
        self.drop = nn.Dropout(p)
        mask = torch.tril(torch.ones(block_size, block_size, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, block_size, block_size), persistent=False)

    def attend(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = self.drop(F.softmax(att.masked_fill(~self.mask[:, :, :T, :T], float("-inf")), dim=-1))
        return self.drop(self.proj((att @ v).transpose(1, 2).contiguous().view(B, T, C)))

    def forward(self, x):
        x = x + self.attend(self.ln_1(x))
        return x + self.drop(self.out(F.relu(self.fc(self.ln_2(x)))))


class Trunk(nn.Module):
    def __init__(self, vocab_size, block_size, p):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, WIDTH)
        self.wpe = nn.Embedding(block_size, WIDTH)
        self.blocks = nn.ModuleList(Block(block_size, p) for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, vocab_size, bias=False)

    def logits(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))
'''

# nanoGPT's convention: forward(idx, targets=None) -> (logits, loss); built by its class with the workload's
# vocab_size and block_size, and a dropout argument (which speedladder sets to 0).
NANO = TRUNK + '''

class GPT(Trunk):
    def __init__(self, vocab_size, block_size, dropout=0.1):
        super().__init__(vocab_size, block_size, dropout)

    def forward(self, idx, targets=None):
        logits = self.logits(idx)
        if targets is None:
            return logits[:, [-1], :], None  # as nanoGPT: only the last position, for generation
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss
'''

# forward(idx) -> logits, built by a function that takes the vocabulary only (its context is fixed).
LOGITS = TRUNK + '''

class LM(Trunk):
    def forward(self, idx):
        return self.logits(idx)


def make_lm(vocab_size):
    return LM(vocab_size, 32, 0.0)
'''

# forward(idx) -> logits with dropout on (p=0.1, not an argument): speedladder switches it off.
DROPOUT = TRUNK + '''

class Noisy(Trunk):
    def __init__(self, vocab_size):
        super().__init__(vocab_size, 32, 0.1)

    def forward(self, idx):
        return self.logits(idx)
'''

# forward(x, y) -> loss: no logits for the gates to compare.
LOSS = TRUNK + '''

class LossOnly(Trunk):
    def __init__(self, vocab_size):
        super().__init__(vocab_size, 32, 0.0)

    def forward(self, x, y):
        logits = self.logits(x)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
'''

# The same with its own hooks for the sdpa and pad-vocab rungs (docs/models.md).
HOOKED = LOGITS + '''

class Fused(Block):
    def attend(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Hooked(LM):
    def speedladder_sdpa(self):
        for block in self.blocks:
            block.__class__ = Fused  # the same parameters, attention through F.scaled_dot_product_attention

    def speedladder_pad_vocab(self, multiple):
        rows = -(-self.lm_head.out_features // multiple) * multiple
        for w in (self.wte.weight, self.lm_head.weight):  # grown in place: the same Parameter objects
            w.data = torch.cat([w.data, w.data.new_zeros(rows - w.shape[0], w.shape[1])])


def make_hooked(vocab_size):
    return Hooked(vocab_size, 32, 0.0)
'''

# No repeated blocks: one embedding and one head.
FLAT = '''
from torch import nn


class Bigram(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, 32)
        self.head = nn.Linear(32, vocab_size)

    def forward(self, idx):
        return self.head(self.wte(idx))
'''

# A forward that none of the conventions describes: a dict.
ODD = '''
from torch import nn


class Odd(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, 8)

    def forward(self, idx):
        return {"hidden": self.wte(idx)}
'''

FILES = {"nano.py": NANO, "logits_only.py": LOGITS, "noisy.py": DROPOUT, "loss_only.py": LOSS, "hooked.py": HOOKED,
         "flat.py": FLAT, "odd.py": ODD}


def write_models(folder: Path) -> Path:
    for name, text in FILES.items():
        (folder / name).write_text(text)
    return folder
