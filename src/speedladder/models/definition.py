"""What speedladder needs of a language model, whoever wrote it: one ModelDef.

Our GPT, a Hugging Face causal LM and a module of the user's own all reach the
ladder through this record (docs/models.md): a zero-argument factory, the
forward convention (detected), one loss computed the same way for every model,
the vocabulary, parameter counts, FLOPs per token (a formula where the
architecture is known, else counted once by torch), the repeated blocks that
checkpointing wraps, the model transforms the rungs apply, and, for each
capability a rung needs and this model lacks, why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from speedladder.models.capability import Capability
from speedladder.models.gpt import GPTConfig
from speedladder.models.model_record import ModelRecord

# How the ladder calls a model and reads its loss. x is (B, T) token ids, y the same shifted by one.
CONVENTIONS: dict[str, str] = {
    "logits_loss": "forward(x, y) -> (logits, loss), nanoGPT's",
    "loss": "forward(x, y) -> loss",
    "logits": "forward(x) -> logits, the loss computed here",
    "hf": "forward(x) -> an output with .logits (Hugging Face), the loss computed here",
}

DROPOUT_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def next_token_loss(logits: torch.Tensor, y: torch.Tensor, vocab: int) -> torch.Tensor:
    """Cross-entropy of every position's next token, as our GPT computes it: in fp32 (fp64 stays fp64), over the
    real vocabulary.

    Hugging Face models shift their labels inside and drop the last position; here the targets are already
    the next tokens, so every position counts, as in our GPT, and losses compare across models. A padded
    head's extra columns are left out.
    """
    if logits.shape[-1] != vocab:  # a padded head (shapes are static: no slice in the graph otherwise)
        logits = logits[..., :vocab]
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)).reshape(-1, vocab), y.reshape(-1))


class Adapted(nn.Module):
    """A model called in its own convention, answering (logits or None, loss) as our GPT does."""

    def __init__(self, model: nn.Module, convention: str, vocab: int) -> None:
        super().__init__()
        self.model = model
        self.convention = convention
        self.vocab = vocab

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        if self.convention == "logits_loss":
            out = self.model(x, y)
            return out[0], out[1]
        if self.convention == "loss":
            return None, self.model(x, y)  # no logits: the gates compare the loss and the gradients
        out = self.model(x)
        logits = out if self.convention == "logits" else out.logits  # (B, T, V)
        return logits, next_token_loss(logits, y, self.vocab)


def dropout_off(model: nn.Module, whole: bool = False) -> int:
    """Dropout off for measuring, gating and training: two runs of one step must compute the same thing.

    Only the dropout modules are switched to eval mode (the rest stays in training mode, which, for
    example, Hugging Face's checkpointing needs), or the whole model when its randomness lives elsewhere.
    Returns how many dropout modules had a rate above zero.
    """
    if whole:
        model.eval()
    active = 0
    for m in model.modules():
        if isinstance(m, DROPOUT_MODULES):
            active += m.p > 0
            m.eval()
    return active


Transform = Callable[[nn.Module], nn.Module]
# The FLOPs formula's terms where a family knows the architecture: (N of the 6N rule, (layers, heads, head size)).
Formula = tuple[int, tuple[int, int, int]]


@dataclass(frozen=True)
class TransformTable:
    """The transforms a family offers a model, by the capability each provides, and why it lacks the others."""

    transforms: Mapping[Capability, Transform] = field(default_factory=dict)
    lacks: Mapping[Capability, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelFamily:
    """What a model family (models/ours.py, hf.py, user.py) exports: how to build its model, which transforms it
    offers, and what it knows of the model without looking; step.workload.define_model turns it into the one ModelDef."""

    kind: str  # "speedladder" (our GPT), "hf" (Hugging Face) or "user"
    name: str  # as results.json and the reports name it
    factory: Callable[[], nn.Module]  # a fresh model, random weights, on the current default device
    offers: Callable[[nn.Module, str | None], TransformTable]  # (a built model, its blocks' path) -> its transforms
    source: Mapping[str, Any] = field(default_factory=dict)  # how it was asked for: what results.json records
    formula: Callable[[nn.Module], Formula | None] | None = None  # the FLOPs formula's terms; None: counted
    convention: str | None = None  # known without a trial forward; None: detected
    targets: bool = True  # whether a trial forward may pass the targets as the second argument
    vocab_size: int | None = None  # known; None: detected
    dropout: str | None = None  # known (the model has none, or its config set it to 0); None: detected
    dropout_given: bool = False  # dropout=0.0 was passed to the user's factory
    shapes: GPTConfig | None = None  # the architecture in our GPT's terms, for the prediction model
    refusal: str | None = None  # what a failing build means, in words (None: "building NAME failed")


@dataclass(frozen=True)
class ModelDef:
    """A model the ladder can climb: how to build it, call it, count it and change it. Built in one place only,
    models.build (from_family, of_module, ours), from a ModelFamily and the Facts detect.facts found."""

    kind: str  # "speedladder" (our GPT), "hf" (Hugging Face) or "user"
    name: str  # as results.json and the reports name it
    factory: Callable[[], nn.Module]  # a fresh model, random weights, on the current default device
    convention: str  # a key of CONVENTIONS
    vocab_size: int  # the real vocabulary: the logits' width before any padding
    params: int  # every parameter once (a tied matrix counts once)
    matmul_params: int | None = None  # N of the 6N rule, where the architecture is known
    attention: tuple[int, int, int] | None = None  # (layers, heads, head size) of the formula's attention term
    blocks: str | None = None  # dotted path of the repeated blocks
    dropout: str = "none"  # what was done about dropout, in words
    whole_eval: bool = False  # the whole model in eval mode (its randomness is outside the dropout modules)
    transforms: Mapping[Capability, Transform] = field(default_factory=dict)  # over the rungs' own
    lacks: Mapping[Capability, str] = field(default_factory=dict)  # why a rung needing it does not apply
    shapes: GPTConfig | None = None  # the architecture in our GPT's terms, for the prediction model; None: unknown
    hooks: tuple[str, ...] = ()  # the speedladder_* methods it defines (detect.hooks_of): what hook rungs need
    source: Mapping[str, Any] = field(default_factory=dict)  # how it was asked for: what results.json records
    # FLOPs per token counted by torch, by sequence length: a cache filled on first use (the record stays frozen).
    counted: dict[int, int] = field(default_factory=dict, compare=False)

    @property
    def flops_method(self) -> str:
        return "formula" if self.matmul_params is not None and self.attention is not None else "counted"

    @property
    def convention_line(self) -> str:
        """The detected convention, the FLOPs method and the dropout handling, in one line for the progress."""
        flops = "by formula" if self.flops_method == "formula" else "counted by torch"
        return f"{CONVENTIONS[self.convention]}; FLOPs per token {flops}; dropout {self.dropout}"

    @property
    def blocks_prefix(self) -> str | None:
        return f"{self.blocks}." if self.blocks else None

    def build(self, device: torch.device) -> nn.Module:
        """A fresh model on a device, dropout off."""
        with torch.device(device):
            model = self.factory()
        model.to(device)
        dropout_off(model, self.whole_eval)
        return model

    def adapter(self, model: nn.Module) -> Adapted:
        return Adapted(model, self.convention, self.vocab_size)

    def transform(self, name: str,
                  shared: Mapping[str, Callable[[nn.Module], nn.Module]]) -> Callable[[nn.Module], nn.Module]:
        """The model transform of that name for this model: its own, else the shared one (the rungs'
        MODEL_TRANSFORMS, written for our GPT: the rungs sit above the models, so the caller hands them in)."""
        cap = Capability.named(name)
        why = self.lacks.get(cap.needs) if cap else None
        if why:
            raise RuntimeError(f"{name}: {why}")
        return (self.transforms.get(cap) if cap else None) or shared[name]

    def blocks_of(self, model: nn.Module) -> list[nn.Module]:
        """The repeated blocks of a built model (after the transforms: a checkpointed block is still one)."""
        return list(cast("nn.ModuleList | nn.Sequential", model.get_submodule(self.blocks))) if self.blocks else []

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token: PaLM's formula where the architecture is known, else counted once by torch."""
        if self.flops_method == "formula":
            assert self.matmul_params is not None and self.attention is not None  # what "formula" means
            return flops_per_token(self.matmul_params, *self.attention, seq_len)
        if seq_len not in self.counted:
            self.counted[seq_len] = count_flops(self, seq_len)
        return self.counted[seq_len]

    def record(self) -> ModelRecord:
        """What results.json keeps about the model, beside its parameter counts."""
        return ModelRecord(kind=self.kind, name=self.name, source=dict(self.source), convention=self.convention,
                           convention_means=CONVENTIONS[self.convention], vocab_size=self.vocab_size,
                           flops_method=self.flops_method, blocks=self.blocks, dropout=self.dropout,
                           not_applicable={str(k): v for k, v in self.lacks.items()})


def flops_per_token(matmul_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> int:
    """Training FLOPs per token, PaLM's convention (Chowdhery et al. 2022, appendix B): 6N + 12*L*H*Q*T.

    6N: forward (2N) and backward (4N) through the weight matmuls; 12LHQT: the
    attention scores and their weighted sum, forward and backward, no credit
    taken for the causal mask. Recomputation (checkpointing) is not counted:
    MFU counts useful work only.
    """
    return 6 * matmul_params + 12 * n_layer * n_head * head_dim * seq_len


def count_flops(model_def: ModelDef, seq_len: int) -> int:
    """FLOPs per token of one forward and backward at batch 1, counted by torch's FlopCounterMode.

    On the meta device where the model builds there (no arithmetic is done), else on the CPU. Like the
    formula, it counts the matmuls (attention's included, no credit for the causal mask) and no recomputation.
    """
    for device in (torch.device("meta"), torch.device("cpu")):
        try:
            model = model_def.build(device)
            x = torch.zeros(1, seq_len, dtype=torch.long, device=device)
            with FlopCounterMode(display=False) as counter:
                _, loss = model_def.adapter(model)(x, x)
                loss.backward()
            return int(counter.get_total_flops()) // seq_len
        except Exception:
            if device.type == "cpu":
                raise
    raise AssertionError("unreachable")
