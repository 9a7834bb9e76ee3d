"""Any PyTorch language model as one ModelDef: ours, a Hugging Face causal LM, or the user's own (docs/models.md).

`define` turns the resolved configuration (and, from the Python API, an object)
into a ModelDef and its initial weights; everything downstream (steps, gates,
FLOPs, the profile, training, data parallelism) reads the model through it.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

import torch
from torch import nn

from speedladder.config.resolved import Resolved
from speedladder.config.run import RunConfig
from speedladder.errors import UsageError, one_line
from speedladder.gpt import GPTConfig, sample_next
from speedladder.models import detect, hf, user
from speedladder.models import ours as ours_family
from speedladder.models.base import CONVENTIONS, Family, ModelDef, count_flops
from speedladder.records.model import ModelRecord

__all__ = ["CONVENTIONS", "ModelDef", "count_flops", "define", "generate", "initial_state", "of_module", "ours",
           "rebuild", "source_of"]


def source_of(run: RunConfig) -> str | None:
    """A FILE.py:NAME made absolute, so a child process or a rank finds the same file (RunConfig checked the
    model flags themselves when it was made)."""
    where, colon, name = (run.model_source or "").rpartition(":")
    if colon and where.endswith(".py"):
        return f"{Path(where).expanduser().resolve()}:{name}"
    return run.model_source


def define(cfg: Resolved, vocab: int | None, obj: Any = None) -> tuple[Resolved, ModelDef, dict[str, torch.Tensor]]:
    """The model a run climbs and its initial weights; `vocab` is the data's (None: the model's).

    `obj` is a model given to the Python API as an object (an nn.Module, a class, a function).
    """
    run = cfg.run
    cfg = cfg.with_run(dataclasses.replace(run, model_source=source_of(run)))
    run = cfg.run
    vocab = run.vocab_size or vocab
    if run.hf:
        family = hf.family(run.hf, run.hf_set, vocab)
    elif run.model_source or obj is not None:
        found = user.load(run.model_source) if obj is None and run.model_source else obj
        # cast: mypy infers `str | None` for getattr's default from the `or` (a __qualname__ is a str)
        name = run.model_source or cast(str, getattr(found, "__qualname__", type(found).__name__))
        family = user.family(found, name, {"model": run.model_source}, vocab, cfg.seq_len)
    else:
        cfg = cfg.with_vocab(vocab) if vocab else cfg
        assert cfg.model is not None  # the preset's GPT: the model is neither Hugging Face's nor the user's
        family = ours_family.family(cfg.model, run.preset)
    model = _build(family, torch.device("cpu"), run.seed)  # one build: the initial weights and the facts
    init = _state(model)  # taken before any trial forward
    return cfg, _model_def(family, model, cfg.seq_len, vocab), init


def _build(family: Family, device: torch.device, seed: int | None = None) -> nn.Module:
    """One model of the family on a device (seeded where given), or one line saying why it cannot be built."""
    if seed is not None:
        torch.manual_seed(seed)
    try:
        with torch.device(device):
            model = family.factory()
    except Exception as e:  # noqa: BLE001 -- the user's code or a config the model refuses: one line, exit 2
        raise UsageError(f"{family.refusal or f'building {family.name} failed'}: {one_line(e)}") from None
    if not isinstance(model, nn.Module):
        raise UsageError(f"{family.name} returned a {type(model).__name__}, not an nn.Module")
    return model


def _model_def(family: Family, model: nn.Module, seq_len: int, vocab: int | None,
               facts: detect.Facts | None = None) -> ModelDef:
    """The one place a ModelDef is made: the family's word, the facts of its built model, the transforms it offers."""
    formula = family.formula(model) if family.formula else None
    found = facts or detect.facts(model, family, seq_len, vocab, formula)
    offered = family.offers(model, found.blocks)
    return ModelDef(kind=family.kind, name=family.name, factory=family.factory, convention=found.convention,
                    vocab_size=found.vocab_size, params=found.params, matmul_params=found.matmul_params,
                    attention=found.attention, blocks=found.blocks, dropout=found.dropout,
                    whole_eval=found.whole_eval, transforms=MappingProxyType(dict(offered.transforms)),
                    lacks=MappingProxyType(dict(offered.lacks)), shapes=family.shapes, hooks=found.hooks,
                    source=MappingProxyType(dict(family.source)))


def ours(cfg: GPTConfig, preset: str | None = None) -> ModelDef:
    """Our GPT's ModelDef, counted on the meta device (nothing allocated; its facts need no forward)."""
    family = ours_family.family(cfg, preset)
    return _model_def(family, _build(family, torch.device("meta")), cfg.block_size, cfg.vocab_size)


def initial_state(model_def: ModelDef, seed: int) -> dict[str, torch.Tensor]:
    """The weights every rung starts from, on the host: the same on any device for a seed."""
    torch.manual_seed(seed)
    with torch.device("cpu"):
        return _state(model_def.factory())


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    """A model's weights as the host copy every rung starts from."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def of_module(module: nn.Module) -> ModelDef:
    """The ModelDef of a model the user already built, for its transforms and blocks alone (speedladder.apply puts
    a winner's rungs on it in place): our GPT's rungs, a Hugging Face model's switches, or any other's blocks and
    hooks. The convention and vocabulary are not detected here: the user's own loop calls the model."""
    from speedladder.gpt import GPT

    name = type(module).__name__
    if isinstance(module, GPT):
        family = ours_family.family(module.cfg)
    elif hf.is_hf(module):
        family = Family(kind="hf", name=name, factory=lambda: module, offers=hf.offers)
    else:
        family = user.family(module, name, {}, None, 0)
    family = dataclasses.replace(family, name=name, factory=lambda: module, formula=None, source={})
    facts = detect.Facts(convention="logits", vocab_size=0, params=sum(p.numel() for p in module.parameters()),
                         blocks=detect.find_blocks(module), hooks=detect.hooks_of(module), dropout="none",
                         whole_eval=False, matmul_params=None, attention=None)
    return _model_def(family, module, 0, None, facts)


def rebuild(record: ModelRecord) -> nn.Module:
    """A Hugging Face or user model again, random weights, from its record (ModelDef.record, as `train` saves it);
    load a checkpoint's weights into it. A user's model is built from the same file, with the same arguments."""
    source = record.source
    if record.kind == "hf":
        return hf.build(hf.config(source["hf"], tuple(source["hf_set"]), record.vocab_size)[0])
    if record.kind == "user":
        factory = functools.partial(user.load(source["model"]), **source["arguments"])
        return _build(Family(kind="user", name=record.name, factory=factory, offers=user.offers), torch.device("cpu"))
    raise UsageError(f"no way to rebuild a model of kind {record.kind!r}")


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
