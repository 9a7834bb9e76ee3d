"""Building a ModelDef and its weights from a family: ours, a Hugging Face causal LM, or the user's own
(docs/models.md). `step.workload.define_model` picks the family from the configuration; everything downstream
(steps, gates, FLOPs, the profile, training, data parallelism) reads the model through the ModelDef made here.
"""

from __future__ import annotations

import dataclasses
import functools
from types import MappingProxyType
from typing import Any, cast

import torch
from torch import nn

from speedladder.errors import UsageError, one_line
from speedladder.models import detect, hf, user
from speedladder.models import ours as ours_family
from speedladder.models.definition import ModelDef, ModelFamily
from speedladder.models.gpt import GPTConfig, sample_next
from speedladder.models.model_record import ModelRecord

__all__ = ["define", "from_family", "generate", "initial_state", "make", "model_def", "of_module", "ours", "rebuild"]


def define(hf_name: str | None, hf_set: tuple[str, ...], source: str | None, obj: Any, vocab: int | None,
           seq_len: int, gpt: GPTConfig | None, preset: str | None,
           seed: int | None) -> tuple[ModelDef, dict[str, torch.Tensor]]:
    """The model a run climbs and its initial weights: a Hugging Face model, the user's (a FILE.py:NAME `source`,
    or `obj`, a model given to the Python API as an object), else our GPT of config `gpt`."""
    if hf_name:
        family = hf.family(hf_name, hf_set, vocab)
    elif source or obj is not None:
        found = user.load(source) if obj is None and source else obj
        # cast: mypy infers `str | None` for getattr's default from the `or` (a __qualname__ is a str)
        name = source or cast(str, getattr(found, "__qualname__", type(found).__name__))
        family = user.family(found, name, {"model": source}, vocab, seq_len)
    else:
        assert gpt is not None  # the preset's GPT: the model is neither Hugging Face's nor the user's
        family = ours_family.family(gpt, preset)
    return from_family(family, seq_len, vocab, seed)


def from_family(family: ModelFamily, seq_len: int, vocab: int | None,
                seed: int | None) -> tuple[ModelDef, dict[str, torch.Tensor]]:
    """The ModelDef of a family and its initial weights, from one seeded build on the host."""
    model = make(family, torch.device("cpu"), seed)  # one build: the initial weights and the facts
    init = _state(model)  # taken before any trial forward
    return model_def(family, model, seq_len, vocab), init


def make(family: ModelFamily, device: torch.device, seed: int | None = None) -> nn.Module:
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


def model_def(family: ModelFamily, model: nn.Module, seq_len: int, vocab: int | None,
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
    return model_def(family, make(family, torch.device("meta")), cfg.block_size, cfg.vocab_size)


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
    from speedladder.models.gpt import GPT

    name = type(module).__name__
    if isinstance(module, GPT):
        family = ours_family.family(module.cfg)
    elif hf.is_hf(module):
        family = ModelFamily(kind="hf", name=name, factory=lambda: module, offers=hf.offers)
    else:
        family = user.family(module, name, {}, None, 0)
    family = dataclasses.replace(family, name=name, factory=lambda: module, formula=None, source={})
    facts = detect.Facts(convention="logits", vocab_size=0, params=sum(p.numel() for p in module.parameters()),
                         blocks=detect.find_blocks(module), hooks=detect.hooks_of(module), dropout="none",
                         whole_eval=False, matmul_params=None, attention=None)
    return model_def(family, module, 0, None, facts)


def rebuild(record: ModelRecord) -> nn.Module:
    """A Hugging Face or user model again, random weights, from its record (ModelDef.record, as `train` saves it);
    load a checkpoint's weights into it. A user's model is built from the same file, with the same arguments."""
    source = record.source
    if record.kind == "hf":
        return hf.build(hf.config(source["hf"], tuple(source["hf_set"]), record.vocab_size)[0])
    if record.kind == "user":
        factory = functools.partial(user.load(source["model"]), **source["arguments"])
        return make(ModelFamily(kind="user", name=record.name, factory=factory, offers=user.offers), torch.device("cpu"))
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
