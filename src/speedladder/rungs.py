"""The techniques: each rung is a small pure transform of a step specification.

A StepSpec says everything a training step does differently from plain eager
fp32. A rung maps the spec it is given (the ladder so far) to a new one, states
in one line why that should be faster, and declares what it needs of the
machine. Changes to the model's structure are named model transforms, applied
to a freshly built model, so the model file stays the reference.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from speedladder.gpt import GPT, merge_heads, split_heads


@dataclass(frozen=True)
class StepSpec:
    """One training step's configuration; the defaults are R0, eager fp32."""

    batch_size: int
    seq_len: int
    compile: bool = False  # torch.compile the model (forward, loss and backward)
    autocast: str | None = None  # None (fp32) or "bf16"
    tf32: bool = False  # fp32 matmuls on tensor cores (CUDA only)
    transforms: tuple[str, ...] = ()  # names in MODEL_TRANSFORMS, applied in order
    compile_mode: str | None = None  # torch.compile's mode: None (default), "max-autotune", "reduce-overhead"
    optimizer: str = "adamw"  # a name in OPTIMIZERS: "adamw", "adamw-fused", "adamw-foreach", "muon"
    lr_scale: float = 1.0  # every optimizer's learning rate times this (the batch rung's --batch-lr-scale rule)

    @property
    def precision(self) -> str:
        """The arithmetic the matmuls run in: what the MFU peak and the gate tolerance depend on."""
        if "float8" in self.transforms:
            return "fp8"
        if self.autocast == "bf16":
            return "bf16"
        return "tf32" if self.tf32 else "fp32"

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    @property
    def cudagraphs(self) -> bool:
        """Whether compiled code replays CUDA graphs, whose outputs the next replay overwrites."""
        return self.compile and self.compile_mode in ("max-autotune", "reduce-overhead")

    @property
    def same_update(self) -> bool:
        """AdamW in any implementation at eager's learning rate: the same update rule, so the loss band applies."""
        return self.optimizer in ADAMW_VARIANTS and self.lr_scale == 1.0

    @property
    def update_change(self) -> str:
        """Why this spec's updates differ from eager's (empty when they do not)."""
        parts = ([f"{self.optimizer} updates differently from AdamW"] if self.optimizer not in ADAMW_VARIANTS else [])
        if self.lr_scale != 1.0:
            parts.append(f"its learning rate is {self.lr_scale:.3g}x eager's")
        return " and ".join(parts)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> StepSpec:
        """A spec saved in results.json (lists for tuples; fields added later take their defaults)."""
        known = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)


ADAMW_VARIANTS = ("adamw", "adamw-fused", "adamw-foreach")
OPTIMIZERS = (*ADAMW_VARIANTS, "muon")


@dataclass(frozen=True)
class Env:
    """What a rung may depend on: the machine and the workload's knobs."""

    device_type: str  # "cuda", "mps" or "cpu"
    cuda_capability: tuple[int, int] | None
    batch_multiplier: int
    # What the model cannot do, as (capability, why): e.g. ("sdpa", "not applicable to this model: ...").
    model_lacks: tuple[tuple[str, str], ...] = ()
    batch_lr_scale: str = "none"  # the batch rung's learning-rate rule (config.BATCH_LR_SCALES)


@dataclass(frozen=True)
class Requirement:
    """What a rung needs; `unmet` says why it cannot run here, or None."""

    devices: tuple[str, ...] = ("cuda", "mps", "cpu")
    min_capability: tuple[int, int] | None = None  # CUDA compute capability
    compiler: bool = False  # inductor's code generator: Triton on CUDA, a C++ compiler on CPU
    modules: tuple[str, ...] = ()  # optional packages, by import name
    install: str | None = None  # how to get them
    model: str | None = None  # a capability of the model: "blocks", "sdpa" or "pad-vocab" (models/base.py)

    def unmet(self, env: Env) -> str | None:
        if env.device_type not in self.devices:
            return f"needs {' or '.join(self.devices)}; this device is {env.device_type}"
        if self.min_capability and env.device_type == "cuda":
            cap = env.cuda_capability or (0, 0)
            if cap < self.min_capability:
                want = ".".join(map(str, self.min_capability))
                return f"needs CUDA compute capability >= {want}; this GPU is {cap[0]}.{cap[1]}"
        lacks = dict(env.model_lacks).get(self.model) if self.model else None
        if lacks:
            return lacks
        missing = [m for m in self.modules if importlib.util.find_spec(m) is None]
        if missing:
            return f"needs {', '.join(missing)}, not installed" + (f": {self.install}" if self.install else "")
        if self.compiler:
            if env.device_type == "cuda" and importlib.util.find_spec("triton") is None:
                return "torch.compile on CUDA needs Triton, which is not installed"
            if env.device_type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
                return "torch.compile on a CPU needs a C++ compiler (g++ or clang++), none found"
        return None


@dataclass(frozen=True)
class Rung:
    name: str
    reason: str  # one line: why it should pay
    kind: str  # "speed", "memory" (expected to cost speed) or "optimizer" (judged by tokens to a loss)
    transform: Callable[[StepSpec, Env], StepSpec]
    requires: Requirement = Requirement()
    # A batch-changing rung also measures this variant of its spec, like with like (docs/measurement.md, rule 6).
    control: Callable[[StepSpec], StepSpec] | None = None
    control_reason: str | None = None


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

    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.n_head = attn.n_head
        self.qkv = attn.qkv
        self.proj = attn.proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = split_heads(self.qkv(x), self.n_head)  # each (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.proj(merge_heads(y))


def use_sdpa(model: GPT) -> GPT:
    for block in model.blocks:
        block.attn = SDPAttention(block.attn)
    return model


VOCAB_MULTIPLE = 64  # nanoGPT's 50257 -> 50304: the head's matmul dimension becomes a multiple of the tile size


def padded_vocab(vocab_size: int, multiple: int = VOCAB_MULTIPLE) -> int:
    return math.ceil(vocab_size / multiple) * multiple


class PaddedHead(nn.Module):
    """The output head over a padded vocabulary; the padding's logits are -inf, so softmax gives them nothing.

    The loss and the logits of the real vocabulary are those of the unpadded head at the same weights.
    """

    def __init__(self, weight: nn.Parameter, vocab_size: int) -> None:
        super().__init__()
        self.weight = weight  # (V_padded, C): the head's own Parameter object, resized
        self.vocab_size = vocab_size
        pad = torch.arange(weight.shape[0], device=weight.device) >= vocab_size
        self.register_buffer("pad", pad, persistent=False)  # (V_padded,) True on the padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight).masked_fill(self.pad, float("-inf"))  # (B, T, V_padded)


def _pad_rows(p: nn.Parameter, rows: int) -> None:
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
    head = model.lm_head.weight
    _pad_rows(head, rows)
    if not model.cfg.tie_embeddings:
        _pad_rows(model.wte.weight, rows)
    model.wte.num_embeddings = rows  # ids stay below the real vocabulary: the extra rows are never looked up
    model.lm_head = PaddedHead(head, vocab)
    return model


FLOAT8_RECIPE = "rowwise"  # torchao's recipe name (Float8LinearConfig.from_recipe_name, torchao >= 0.9)


def float8_eligible(module: nn.Module, name: str, prefix: str) -> bool:
    """A Linear the fp8 rung converts: under the blocks' prefix, both dimensions divisible by 16 (fp8 matmuls'
    constraint). The head stays in bf16: the softmax over the vocabulary is sensitive."""
    return (isinstance(module, nn.Linear) and name.startswith(prefix)
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def float8_matmul_params(model: nn.Module, prefix: str = "blocks.") -> int:
    """The weights in the matmuls the fp8 rung runs in fp8: 6 x this is their training FLOPs per token, the fp8
    share of the step that the rung's MFU peak is blended by (measure.blended_peak)."""
    return sum(m.in_features * m.out_features for name, m in model.named_modules() if float8_eligible(m, name, prefix))


def float8_linears(model: nn.Module, prefix: str = "blocks.", recipe: str = FLOAT8_RECIPE,
                   emulate: bool = False) -> nn.Module:
    """torchao's float8 training for the block Linears (under `prefix`); the head stays in bf16.

    The rowwise recipe: every operand scaled per row (one scale per token for the activations, e4m3 throughout,
    scales rounded to powers of two). A token's scale depends on that token alone, so the function stays causal:
    the tensorwise recipe takes one amax over the whole batch, and changing future tokens re-rounds past logits,
    which the causality probe rightly flags. `emulate`: the same casts with the matmuls done in high precision
    (torchao's emulation), which runs on a CPU: what the tests use.
    """
    # An optional extra, checked by the rung's requirement.
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(recipe)
    if emulate:
        config = dataclasses.replace(config, emulate=True)
    return convert_to_float8_training(model, config=config,
                                      module_filter_fn=lambda m, name: float8_eligible(m, name, prefix))


# Model transforms keep every parameter object, so weights loaded before them stay in place
# (pad-vocab grows the vocabulary's rows in place; TrainStep maps them back to the reference shapes).
MODEL_TRANSFORMS: dict[str, Callable[[GPT], nn.Module]] = {
    "activation-checkpointing": checkpoint_blocks,
    "sdpa": use_sdpa,
    "pad-vocab": pad_vocab,
    "float8": float8_linears,
}


def _fp32_control(spec: StepSpec) -> StepSpec:
    return dataclasses.replace(spec, autocast=None, tf32=False)


def _with(spec: StepSpec, transform: str) -> StepSpec:
    return dataclasses.replace(spec, transforms=(*spec.transforms, transform))


def lr_factor(rule: str, multiplier: int) -> float:
    """The learning rate's factor for a batch K times bigger: none 1, sqrt sqrt(K), linear K."""
    return {"none": 1.0, "sqrt": math.sqrt(multiplier), "linear": float(multiplier)}[rule]


def _batch_up(spec: StepSpec, env: Env) -> StepSpec:
    k = env.batch_multiplier
    return dataclasses.replace(spec, batch_size=spec.batch_size * k,
                               lr_scale=spec.lr_scale * lr_factor(env.batch_lr_scale, k))


def _fused_adamw(spec: StepSpec, env: Env) -> StepSpec:
    # Fused AdamW kernels exist for CUDA and (since torch 2.4) the CPU; elsewhere foreach batches the update.
    return dataclasses.replace(spec, optimizer="adamw-fused" if env.device_type in ("cuda", "cpu") else "adamw-foreach")


RUNGS: dict[str, Rung] = {r.name: r for r in (
    Rung("eager", "R0: the baseline, eager PyTorch in fp32", "speed",
         lambda s, e: s),
    Rung("compile", "R1: fuse the elementwise tail into fewer kernels, cut Python dispatch", "speed",
         lambda s, e: dataclasses.replace(s, compile=True),
         Requirement(compiler=True)),
    Rung("bf16", "R2: bf16 autocast halves bytes and runs matmuls on tensor cores; TF32 for what stays fp32",
         "speed",
         lambda s, e: dataclasses.replace(s, autocast="bf16", tf32=e.device_type == "cuda"),
         Requirement(min_capability=(8, 0))),
    Rung("batch", "R3: a bigger batch fills the device and spreads per-step overhead over more tokens",
         "speed",
         _batch_up,
         control=_fp32_control,
         control_reason="the same batch in fp32: did bf16 buy the memory headroom for it?"),
    Rung("ckpt", "R4: activation checkpointing per block trades one recomputed forward for activation memory",
         "memory",
         lambda s, e: _with(s, "activation-checkpointing"),
         Requirement(model="blocks")),
    Rung("sdpa", "fused attention (F.scaled_dot_product_attention): no (T, T) score matrix in memory, "
         "Flash kernels on CUDA", "speed",
         lambda s, e: _with(s, "sdpa"),
         Requirement(model="sdpa")),
    Rung("fused-adamw", "AdamW's whole update in one fused kernel (fused=True; foreach where fused is missing)",
         "speed", _fused_adamw),
    Rung("pad-vocab", f"vocabulary padded to a multiple of {VOCAB_MULTIPLE} (50257 -> 50304) for aligned matmul "
         "tiles; the padding is masked out", "speed",
         lambda s, e: _with(s, "pad-vocab"),
         Requirement(model="pad-vocab")),
    Rung("max-autotune", "torch.compile mode=max-autotune: benchmarks matmul/conv kernels and replays CUDA graphs",
         "speed",
         lambda s, e: dataclasses.replace(s, compile=True, compile_mode="max-autotune"),
         Requirement(devices=("cuda",), compiler=True)),
    Rung("cudagraphs", "torch.compile mode=reduce-overhead: CUDA graphs replay a step's launches in one call",
         "speed",
         lambda s, e: dataclasses.replace(s, compile=True, compile_mode="reduce-overhead"),
         Requirement(devices=("cuda",), compiler=True)),
    Rung("muon", "Muon (orthogonalized momentum) for hidden matrices: fewer tokens to a loss, not more tokens/s",
         "optimizer",
         lambda s, e: dataclasses.replace(s, optimizer="muon"),
         Requirement(model="blocks")),
    Rung("fp8", "float8 matmuls (torchao) for the block Linears: twice bf16's tensor-core rate on Hopper",
         "speed",
         lambda s, e: _with(s, "float8"),
         Requirement(devices=("cuda",), min_capability=(8, 9), compiler=True, modules=("torchao",),
                     install="pip install speedladder[fp8]", model="blocks")),
)}


def compose(names: tuple[str, ...], spec: StepSpec, env: Env) -> StepSpec:
    """The spec that the named rungs give when each is applied to the last, with no gates in between."""
    for name in names:
        spec = RUNGS[name].transform(spec, env)
    return spec
