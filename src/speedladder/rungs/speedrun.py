"""The speedrun's model records as rungs, declared through the public rung API (they double as its examples).

modded-nanogpt's speedrun trains GPT-2 124M to 3.28 val loss on FineWeb as fast as it can; most of its records
change the model rather than the kernels, and its README lists them: "Modernized architecture: Rotary embeddings,
QK-Norm, and ReLU^2", and "Logit softcapping (following Gemma 2)", whose cap record 18 (01/04/25) lowered from 30
to 15. Each rung below calls a hook of the model's: speedladder's GPT has them (models/gpt.py), and a user's model that
defines a method of the same name climbs them too. They change the function, so they are architecture rungs: the
causality probe, the learns-check and the race judge them, never the equivalence gates. They were found on GPT-2
at scale; on a small model they may be noise or a loss, and the race says which.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from speedladder.models.gpt import GPTConfig
from speedladder.rungs.registry import Requirement, define

SOFTCAP = 15.0  # the speedrun's cap since its record 18 (it was 30 before)


def hook(name: str, *args: float) -> Callable[[nn.Module], nn.Module]:
    """A model transform that calls the model's own hook method, which changes it in place."""
    def transform(model: nn.Module) -> nn.Module:
        getattr(model, name)(*args)
        return model
    transform.__name__ = name
    return transform


def even_head(cfg: GPTConfig) -> str | None:
    """Rotary positions turn pairs of channels: a head needs an even size."""
    return None if cfg.head_dim % 2 == 0 else f"rotary positions need an even head size, not {cfg.head_dim}"


define("qk-norm", "QK-norm: queries and keys RMS-normalized per head keep attention logits bounded, so a higher "
       "learning rate trains stably (Henry et al. 2020; modded-nanogpt's architecture records)", "architecture",
       model=hook("speedladder_qk_norm"), requires=Requirement(hooks=("speedladder_qk_norm",)))
define("relu2", "ReLU^2 activation in the MLP: sparser, and better per token than GELU (So et al. 2021, Primer; "
       "modded-nanogpt's architecture records)", "architecture",
       model=hook("speedladder_relu2"), requires=Requirement(hooks=("speedladder_relu2",)))
define("rotary", "rotary position embeddings instead of a learned table: relative positions, no table to learn "
       "(Su et al. 2021, RoFormer; modded-nanogpt's architecture records)", "architecture",
       model=hook("speedladder_rotary"), requires=Requirement(hooks=("speedladder_rotary",), shape=even_head))
define("softcap", f"logits soft-capped at {SOFTCAP:g} by tanh keep the head from overconfident logits early "
       "(Gemma 2, 2024; modded-nanogpt's record 18 lowered the cap from 30 to 15)", "architecture",
       model=hook("speedladder_softcap", SOFTCAP), requires=Requirement(hooks=("speedladder_softcap",)))
