"""The built-in rungs, declared through the rung API (api.py) as a user's own are, and the model transforms they use.

Each rung is a small pure transform of a step specification with a one-line reason and a declared requirement.
Changes to the model's structure are model transforms, applied to a freshly built model, so the model file stays
the reference. The speedrun's model records are in speedrun.py.
"""

from __future__ import annotations

import dataclasses
import functools

from speedladder.models.float8 import fits, float8_linears
from speedladder.models.transforms import VOCAB_MULTIPLE, checkpoint_blocks, pad_vocab, use_sdpa
from speedladder.rungs.registry import Env, Requirement, RungError, define, lr_factor
from speedladder.spec import Capability, StepSpec


def _fp32_control(spec: StepSpec) -> StepSpec:
    return dataclasses.replace(spec, autocast=None, tf32=False)


def _batch_up(spec: StepSpec, env: Env) -> StepSpec:
    k = env.batch_multiplier
    return dataclasses.replace(spec, batch_size=spec.batch_size * k,
                               lr_scale=spec.lr_scale * lr_factor(env.batch_lr_scale, k))


def _one_precision(spec: StepSpec, mine: str) -> None:
    """A precision rung on a spec that already has the other autocast precision: the second would undo the first."""
    if spec.autocast is not None and spec.autocast != mine:
        raise RungError(f"{mine} on a {spec.autocast} step: fp16 and bf16 are two precisions of one step, give one "
                        "of them")


def _bf16(spec: StepSpec, env: Env) -> StepSpec:
    _one_precision(spec, "bf16")
    return dataclasses.replace(spec, autocast="bf16", tf32=env.device_type == "cuda")


def _fp16(spec: StepSpec, env: Env) -> StepSpec:
    _one_precision(spec, "fp16")
    return dataclasses.replace(spec, autocast="fp16")


def _accumulate(spec: StepSpec, env: Env) -> StepSpec:
    """The batch rung's batch (the workload's times the multiplier, its learning-rate rule too), reached in the
    recipe's micro-steps (by default the multiplier: micro-batches of the workload's batch). On the batch rung's
    spec it keeps that batch and only splits it, so it is measured and gated beside it at the same shape."""
    base = env.base_batch or spec.batch_size
    k = env.batch_multiplier
    if spec.batch_size == base:
        spec = _batch_up(spec, env)
    elif spec.batch_size != base * k:
        raise RungError(f"accum reaches the batch rung's batch ({base} x {k}) from the workload's; this step's batch "
                        f"is {spec.batch_size}")
    n = env.accum_steps or k
    if spec.batch_size % n:
        raise RungError(f"a batch of {spec.batch_size} does not split into {n} equal micro-batches")
    return dataclasses.replace(spec, accum=n)


def _compiled(spec: StepSpec, env: Env) -> StepSpec:
    # fp8 compiled: inductor fuses each operand's amax, scale and cast around the fp8 matmul (eager, the rung ran at
    # 0.22x bf16 on an H200, 2026-12-04, at 837fae3); a mode the base compiled in (CUDA graphs) is kept.
    return dataclasses.replace(spec, compile=True)


def _fused_adamw(spec: StepSpec, env: Env) -> StepSpec:
    # Fused AdamW kernels exist for CUDA and (since torch 2.4) the CPU; elsewhere foreach batches the update.
    return dataclasses.replace(spec, optimizer="adamw-fused" if env.device_type in ("cuda", "cpu") else "adamw-foreach")


# Model transforms keep every parameter object, so weights loaded before them stay in place (pad-vocab grows the
# vocabulary's rows in place; TrainStep maps them back to the reference shapes).
define("eager", "R0: the baseline, eager PyTorch in fp32", "speed", spec={})
define("compile", "R1: fuse the elementwise tail into fewer kernels, cut Python dispatch", "speed",
       spec={"compile": True}, requires=Requirement(compiler=True))
define("bf16", "R2: bf16 autocast halves bytes and runs matmuls on tensor cores (AVX-512 BF16 or AMX on a CPU: "
       "measured anyway where bf16 is emulated); TF32 for what stays fp32", "speed", spec=_bf16,
       requires=Requirement(min_capability=(8, 0)))
define("batch", "R3: a bigger batch fills the device and spreads per-step overhead over more tokens", "speed",
       spec=_batch_up, control=_fp32_control,
       control_reason="the same batch in fp32: did bf16 buy the memory headroom for it?")
define("accum", "the batch rung's batch by gradient accumulation over micro-batches of the workload's: the same "
       "update in a micro-batch's activation memory, the optimizer's share spread over more tokens", "speed",
       spec=_accumulate)
define("fp16", "fp16 autocast with a gradient scaler (torch.amp): half the bytes and tensor cores where bf16 is "
       "missing (CUDA capability < 8.0: T4, V100)", "speed", spec=_fp16)
define("ckpt", "R4: activation checkpointing per block trades one recomputed forward for activation memory",
       "memory", model=checkpoint_blocks, transform=Capability.CHECKPOINTING,
       requires=Requirement(model=Capability.BLOCKS))
define("sdpa", "fused attention (F.scaled_dot_product_attention): no (T, T) score matrix in memory, Flash kernels "
       "on CUDA", "speed", model=use_sdpa, requires=Requirement(model=Capability.SDPA))
define("fused-adamw", "AdamW's whole update in one fused kernel (fused=True; foreach where fused is missing)",
       "speed", spec=_fused_adamw)
define("pad-vocab", f"vocabulary padded to a multiple of {VOCAB_MULTIPLE} (50257 -> 50304) for aligned matmul "
       "tiles; the padding is masked out", "speed", model=pad_vocab,
       requires=Requirement(model=Capability.PAD_VOCAB))
define("max-autotune", "torch.compile mode=max-autotune: benchmarks matmul/conv kernels and replays CUDA graphs",
       "speed", spec={"compile": True, "compile_mode": "max-autotune"},
       requires=Requirement(devices=("cuda",), compiler=True))
define("cudagraphs", "torch.compile mode=reduce-overhead: CUDA graphs replay a step's launches in one call", "speed",
       spec={"compile": True, "compile_mode": "reduce-overhead"}, requires=Requirement(devices=("cuda",), compiler=True))
define("muon", "Muon (orthogonalized momentum) for hidden matrices: fewer tokens to a loss, not more tokens/s",
       "optimizer", spec={"optimizer": "muon"}, requires=Requirement(model=Capability.BLOCKS))
FP8_NEEDS = Requirement(devices=("cuda",), min_capability=(8, 9), compiler=True, modules=("torchao",),
                        install="pip install speedladder[fp8]", model=Capability.BLOCKS)
define("fp8", "float8 matmuls (torchao, rowwise: a token's scale is its own) for the block Linears torchao's filter "
       "keeps: twice bf16's tensor-core rate on Hopper", "speed",
       spec=_compiled, model=float8_linears, transform=Capability.FLOAT8,
       requires=dataclasses.replace(FP8_NEEDS, shape=fits("rowwise")))
define("fp8-tensorwise", "float8 matmuls (torchao, one scale a tensor: its fastest recipe, but a scale over the "
       "whole batch sees future tokens) for the block Linears torchao's filter keeps", "speed",
       spec=_compiled, model=functools.partial(float8_linears, recipe="tensorwise"),
       transform=Capability.FLOAT8_TENSORWISE, requires=dataclasses.replace(FP8_NEEDS, shape=fits("tensorwise")))
