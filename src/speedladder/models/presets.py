"""The named models and the workloads they are measured on: the two reference setups and their scaled-down kin.

Defaults of a run that depend on the preset (batch shape, timing, the batch rung's multiplier) live here beside the
model they belong to; config.resolve fills them in where the user gave none.
"""

from __future__ import annotations

from dataclasses import dataclass

from speedladder.models.gpt import GPTConfig


@dataclass(frozen=True)
class Preset:
    """A named model and the workload it is measured on unless flags say otherwise."""

    model: GPTConfig  # its vocabulary is replaced by the tokenizer's once the corpus is loaded
    corpus: str
    tokenizer: str
    batch_size: int
    seq_len: int
    batch_multiplier: int  # R3 multiplies the batch by this
    steps_per_window: int
    warmup_steps: int  # warm-up steps with no compilation needed before timing starts


PRESETS: dict[str, Preset] = {
    # The small GPT of the d2l-style source: 28 characters, width 512, 6 blocks, ~19M parameters; T=128, B=64,
    # batch-up to 512.
    "d2l-512": Preset(GPTConfig(vocab_size=28, block_size=128, n_layer=6, n_head=8, n_embd=512, mlp_hidden=2048,
                                activation="relu"),
                      "timemachine", "char", batch_size=64, seq_len=128, batch_multiplier=8, steps_per_window=20,
                      warmup_steps=5),
    # Same at width 256: the source's example where bf16 goes backwards (matmuls too small).
    "d2l-256": Preset(GPTConfig(vocab_size=28, block_size=128, n_layer=6, n_head=4, n_embd=256, mlp_hidden=1024,
                                activation="relu"),
                      "timemachine", "char", batch_size=64, seq_len=128, batch_multiplier=8, steps_per_window=20,
                      warmup_steps=5),
    # Scaled down so `speedladder run` on 2 CPU cores ends in about 5 minutes with cold compile caches (measured in
    # docs/benchmarks.md); 10 steps a window make windows of 0.25-1 s.
    "d2l-cpu": Preset(GPTConfig(vocab_size=28, block_size=64, n_layer=2, n_head=4, n_embd=128, mlp_hidden=512,
                                activation="relu"),
                      "timemachine", "char", batch_size=16, seq_len=64, batch_multiplier=4, steps_per_window=10,
                      warmup_steps=2),
    # GPT-2 small, nanoGPT-compatible (124,439,808 parameters counting position embeddings); B=16, T=1024.
    # Batch-up x4, not x8: a guess (untested on a GPU) that keeps the fp32 control's full-vocabulary logits
    # within memory.
    "gpt2-124m": Preset(GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768,
                                  mlp_hidden=3072, tie_embeddings=True, activation="gelu"),
                        "tinyshakespeare", "gpt2", batch_size=16, seq_len=1024, batch_multiplier=4,
                        steps_per_window=10, warmup_steps=3),
    # For tests: compiles in seconds.
    "tiny": Preset(GPTConfig(vocab_size=28, block_size=32, n_layer=2, n_head=2, n_embd=32, mlp_hidden=64,
                             activation="relu"),
                   "timemachine", "char", batch_size=4, seq_len=32, batch_multiplier=2, steps_per_window=3,
                   warmup_steps=1),
}

CUDA_DEFAULT_PRESET = "d2l-512"
FALLBACK_PRESET = "d2l-cpu"  # without CUDA the reference setup would take far longer than a few minutes
