"""Any PyTorch language model as one ModelDef: ours, a Hugging Face causal LM, or the user's own (docs/models.md).

`define` turns the resolved configuration (and, from the Python API, an object)
into a ModelDef and its initial weights; everything downstream (steps, gates,
FLOPs, the profile, training, data parallelism) reads the model through it.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, cast

import torch

from speedladder.config.resolved import Resolved
from speedladder.config.run import RunConfig
from speedladder.errors import UsageError
from speedladder.gpt import sample_next
from speedladder.models import hf, user
from speedladder.models.base import CONVENTIONS, ModelDef, count_flops, find_blocks, hooks_of
from speedladder.models.ours import ours

__all__ = ["CONVENTIONS", "ModelDef", "count_flops", "define", "generate", "initial_state", "of_module", "ours",
           "rebuild", "source_of"]


def source_of(run: RunConfig) -> str | None:
    """A FILE.py:NAME made absolute, so a child process or a rank finds the same file (RunConfig checked the
    model flags themselves when it was made)."""
    where, colon, name = (run.model_source or "").rpartition(":")
    if colon and where.endswith(".py"):
        return f"{Path(where).expanduser().resolve()}:{name}"
    return run.model_source


def initial_state(model_def: ModelDef, seed: int) -> dict[str, torch.Tensor]:
    """The weights every rung starts from, on the host: the same on any device for a seed."""
    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = model_def.factory()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def define(cfg: Resolved, vocab: int | None, obj: Any = None) -> tuple[Resolved, ModelDef, dict[str, torch.Tensor]]:
    """The model a run climbs and its initial weights; `vocab` is the data's (None: the model's).

    `obj` is a model given to the Python API as an object (an nn.Module, a class, a function).
    """
    run = cfg.run
    cfg = cfg.with_run(dataclasses.replace(run, model_source=source_of(run)))
    run = cfg.run
    vocab = run.vocab_size or vocab
    if run.hf:
        d, init = hf.define(run.hf, run.hf_set, vocab, cfg.seq_len, run.seed)
    elif run.model_source or obj is not None:
        found = user.load(run.model_source) if obj is None and run.model_source else obj
        # cast: mypy infers `str | None` for getattr's default from the `or` (a __qualname__ is a str)
        name = run.model_source or cast(str, getattr(found, "__qualname__", type(found).__name__))
        d, init = user.define(found, name, {"model": run.model_source}, vocab, cfg.seq_len, run.seed)
    else:
        cfg = cfg.with_vocab(vocab) if vocab else cfg
        assert cfg.model is not None  # the preset's GPT: the model is neither Hugging Face's nor the user's
        d = ours(cfg.model, run.preset)
        init = initial_state(d, run.seed)
    return cfg, d, init


def of_module(module: torch.nn.Module) -> ModelDef:
    """The ModelDef of a model the user already built, for its transforms and blocks alone (speedladder.apply puts
    a winner's rungs on it in place): our GPT's rungs, a Hugging Face model's switches, or any other's blocks and
    hooks. The convention and vocabulary are not detected here: the user's own loop calls the model."""
    from speedladder.gpt import GPT

    base: dict[str, Any] = {"name": type(module).__name__, "factory": lambda: module, "convention": "logits",
                            "vocab_size": 0, "params": sum(p.numel() for p in module.parameters()),
                            "hooks": hooks_of(module)}
    if isinstance(module, GPT):
        return ModelDef(kind="speedladder", blocks="blocks", **base)
    d = ModelDef(kind="hf" if hf.is_hf(module) else "user", blocks=find_blocks(module), **base)
    if d.kind == "hf":
        hf.add_transforms(d)
    else:
        user.add_transforms(d, module)
    return d


def rebuild(record: dict[str, Any]) -> torch.nn.Module:
    """A Hugging Face or user model again, random weights, from its record (ModelDef.record, as `train` saves it);
    load a checkpoint's weights into it. A user's model is built from the same file, with the same arguments."""
    source = record["source"]
    if record["kind"] == "hf":
        return hf.build(hf.config(source["hf"], tuple(source["hf_set"]), record["vocab_size"])[0])
    if record["kind"] == "user":
        return user.build_checked(functools.partial(user.load(source["model"]), **source["arguments"]), record["name"])
    raise UsageError(f"no way to rebuild a model of kind {record['kind']!r}")


@torch.no_grad()
def generate(model_def: ModelDef, model: torch.nn.Module, idx: torch.Tensor, new_tokens: int, temperature: float,
             top_k: int, context: int, generator: torch.Generator | None = None) -> torch.Tensor | None:
    """Extend idx (B, T) by new_tokens sampled one at a time through the model's convention; None when its forward
    returns no logits. top_k 0 samples from the whole vocabulary."""
    adapted = model_def.adapter(model)
    for _ in range(new_tokens):
        window = idx[:, -context:]
        logits, _ = adapted(window, window)  # the targets only make a nanoGPT-style forward return every position
        if logits is None:
            return None
        nxt = sample_next(logits[:, -1, : model_def.vocab_size], temperature, top_k, generator)  # (B, 1)
        idx = torch.cat([idx, nxt], dim=1)
    return idx
