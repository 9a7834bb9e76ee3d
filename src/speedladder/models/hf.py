"""Hugging Face causal LMs, built offline from a config with random weights: `--hf gpt2|llama|PATH/config.json`.

transformers is an optional extra (`pip install speedladder[hf]`). Nothing is
downloaded: the config is transformers' own default for gpt2 and llama, or a
local config.json, changed by `--hf-set KEY=VALUE`. The rungs map onto the
library's own switches: sdpa is attn_implementation "eager" -> "sdpa", ckpt
is activation_checkpointing_enable(), pad-vocab is resize_token_embeddings(
pad_to_multiple_of=64) with the padding's logits left out of the loss.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from speedladder.errors import UsageError, one_line
from speedladder.models.capability import Capability
from speedladder.models.definition import Formula, ModelFamily, Transform, TransformTable
from speedladder.models.float8 import float8_transforms
from speedladder.models.gpt import GPTConfig
from speedladder.models.transforms import VOCAB_MULTIPLE, padded_vocab

# A transformers PreTrainedModel: its methods (set_attn_implementation, resize_token_embeddings, ...) are the
# library's, and transformers is an optional extra without type information here.
HFModel = Any

NAMED = {"gpt2": "GPT2Config", "llama": "LlamaConfig"}
# GPT-2's names for Llama-style configs, so that the same --hf-set works for both.
ALIASES = {"n_layer": "num_hidden_layers", "n_embd": "hidden_size", "n_head": "num_attention_heads",
           "n_positions": "max_position_embeddings", "n_inner": "intermediate_size"}


def transformers() -> Any:
    """The transformers module, offline; without it, one line that says how to get it."""
    if importlib.util.find_spec("transformers") is None:
        raise UsageError("--hf needs Hugging Face transformers: pip install speedladder[hf]")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # built from a config: nothing may be downloaded
    import transformers as tf

    tf.logging.set_verbosity_error()  # config warnings (e.g. a tiny vocabulary's token ids) are not ours to print
    return tf


def _value(text: str) -> Any:
    """An --hf-set value as JSON (numbers, true/false, null), else the string itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def config(name: str, overrides: tuple[str, ...], vocab: int | None) -> tuple[Any, list[str]]:
    """The model's config, with the workload's vocabulary, the overrides and every dropout at 0."""
    tf = transformers()
    if name in NAMED:
        cls, base = getattr(tf, NAMED[name]), {}
    else:
        path = Path(name).expanduser()
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise UsageError(f"--hf wants {', '.join(NAMED)} or a path to a config.json; {name} is neither")
        try:
            base = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UsageError(f"{path} is not valid JSON: {e}") from None
        kind = base.pop("model_type", None) if isinstance(base, dict) else None
        if kind is None:
            raise UsageError(f"{path} has no model_type: not a Hugging Face config.json")
        try:
            cls = type(tf.AutoConfig.for_model(kind))
        except ValueError:  # a model_type this transformers does not know
            raise UsageError(f"{path}: model_type {kind!r} is not one that transformers {tf.__version__} "
                             "knows") from None
    probe = cls()
    values: dict[str, Any] = dict(base, **({"vocab_size": vocab} if vocab else {}))
    for item in overrides:
        key, eq, text = item.partition("=")
        key = cls.attribute_map.get(key, key) if hasattr(cls, "attribute_map") else key
        key = key if hasattr(probe, key) else ALIASES.get(key, key)
        if not eq or not hasattr(probe, key):
            raise UsageError(f"--hf-set {item!r}: {cls.__name__} has no field {item.partition('=')[0]!r}"
                             if eq else f"--hf-set wants KEY=VALUE, got {item!r}")
        values[key] = _value(text)
    dropped = [k for k, v in {**probe.to_dict(), **values}.items() if "drop" in k and isinstance(v, float) and v]
    values.update({k: 0.0 for k in dropped}, use_cache=False)
    try:
        cfg = cls(**values)
    except Exception as e:  # noqa: BLE001 -- e.g. a width the heads do not divide: one line
        raise UsageError(f"{cls.__name__} refused the settings: {one_line(e)}") from None
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):  # a tiny vocabulary has no room for GPT-2's
        if isinstance(getattr(cfg, key, None), int) and getattr(cfg, key) >= cfg.vocab_size:
            setattr(cfg, key, None)
    return cfg, dropped


def build(cfg: Any) -> nn.Module:
    """A random-weight model from the config, plain attention (the sdpa rung switches it), fp32.

    Each model gets a copy of the config: the rungs change the model's own (pad-vocab its vocab_size, sdpa its
    attention), and the next model built must not see that.
    """
    model = transformers().AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="eager")
    return model.to(torch.float32)


def use_sdpa(model: HFModel) -> HFModel:
    model.set_attn_implementation("sdpa")
    return model


def checkpointing(model: HFModel) -> HFModel:
    """The library's own activation checkpointing of every decoder layer (gradient_checkpointing_enable in releases
    without activation_checkpointing_enable)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


def pad_vocab(model: HFModel) -> HFModel:
    """resize_token_embeddings(pad_to_multiple_of=64), keeping the parameter objects the step holds.

    The padding's logits are not masked in the model: the loss (models.base.next_token_loss) and the gates
    read the real vocabulary only, so the padded head computes the same function.
    """
    vocab = model.config.vocab_size
    if padded_vocab(vocab) == vocab:
        return model
    old = {"in": model.get_input_embeddings().weight, "out": model.get_output_embeddings().weight}
    model.resize_token_embeddings(vocab, pad_to_multiple_of=VOCAB_MULTIPLE, mean_resizing=False)
    for side, module in (("in", model.get_input_embeddings()), ("out", model.get_output_embeddings())):
        if module.weight is not old[side]:  # a new Parameter: give its rows to the old one, and put it back
            old[side].data = module.weight.data
            module.weight = old[side]
    return model


def _formula(model: HFModel, kind: str, cfg: Any) -> Formula | None:
    """N and the attention term for GPT-2 and Llama; None for any other architecture (counted)."""
    params = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight is emb
    lookups = (0 if tied else emb.numel())  # an untied token table does no arithmetic; tied, it is the head
    if kind == "gpt2":
        lookups += model.transformer.wpe.weight.numel()  # the learned position table
        return params - lookups, (cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head)
    if kind == "llama":
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return params - lookups, (cfg.num_hidden_layers, cfg.num_attention_heads, head_dim)
    return None


def _shapes(kind: str, cfg: Any) -> GPTConfig | None:
    """GPT-2 in our GPT's terms (the same matmuls), for the prediction model; None for other architectures."""
    if kind != "gpt2":
        return None
    try:
        return GPTConfig(vocab_size=cfg.vocab_size, block_size=cfg.n_positions, n_layer=cfg.n_layer, n_head=cfg.n_head,
                         n_embd=cfg.n_embd, mlp_hidden=cfg.n_inner or 4 * cfg.n_embd,
                         tie_embeddings=bool(cfg.tie_word_embeddings), activation="gelu")
    except ValueError:  # e.g. heads that do not divide the width: building the model says so, in one line
        return None


def family(name: str, overrides: tuple[str, ...], vocab: int | None) -> ModelFamily:
    """A Hugging Face model from its config: built with random weights, its convention found by a trial forward
    of x alone (its second argument is not the targets), FLOPs by formula for GPT-2 and Llama."""
    cfg, dropped = config(name, overrides, vocab)
    kind = cfg.model_type
    return ModelFamily(kind="hf", name=f"Hugging Face {_class_name(cfg)}", factory=functools.partial(build, cfg),
                  offers=offers, formula=functools.partial(_formula, kind=kind, cfg=cfg), targets=False,
                  refusal=f"{type(cfg).__name__} settings refused by the model",
                  dropout=("off: config " + ", ".join(f"{k}=0" for k in dropped)) if dropped else "none: its config "
                          "sets no dropout",
                  shapes=_shapes(kind, cfg),
                  source={"hf": name, "hf_set": list(overrides), "model_type": kind,
                          "config": json.loads(cfg.to_json_string())})


def _class_name(cfg: Any) -> str:
    """The causal LM class transformers builds for this config, e.g. GPT2LMHeadModel."""
    try:
        return str(transformers().AutoModelForCausalLM._model_mapping[type(cfg)].__name__)
    except Exception:  # noqa: BLE001 -- a private table: without it, the config's name; building then says more
        return type(cfg).__name__


def offers(model: nn.Module, blocks: str | None) -> TransformTable:
    """The rungs on a Hugging Face model, through the library's own switches; fp8 acts on the blocks found."""
    transforms: dict[Capability, Transform] = {Capability.CHECKPOINTING: checkpointing, Capability.SDPA: use_sdpa,
                                               Capability.PAD_VOCAB: pad_vocab}
    if not blocks:
        return TransformTable(transforms, {Capability.BLOCKS: "not applicable to this model: no repeated blocks found"})
    transforms.update(float8_transforms(prefix=f"{blocks}."))  # each fp8 rung's, at these blocks
    return TransformTable(transforms)


def is_hf(model: nn.Module) -> bool:
    """A Hugging Face transformers model (without importing transformers where it is not installed)."""
    return any(c.__module__.startswith("transformers.") and c.__name__ == "PreTrainedModel"
               for c in type(model).__mro__)
