"""The facts of a built model, gathered in one call (`facts`): how to call it, its vocabulary, its blocks, its hooks,
what was done about dropout, and how its FLOPs are counted.

How to call a model nobody described is found by one trial forward on a batch of one sequence, read by its shape.
The conventions (models.base.CONVENTIONS) are told apart by what the forward
takes and returns: (logits, loss) or a loss for forward(x, y), logits or an
object with .logits for forward(x). Logits are (1, T, V); V is the model's
vocabulary. Nothing is guessed: what cannot be told apart is refused in one
line that names the accepted conventions.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from speedladder.errors import UsageError, one_line
from speedladder.models.definition import CONVENTIONS, Adapted, Formula, ModelFamily, dropout_off

# The hooks a module of the user's own may define (docs/models.md, "Hooks").
HOOK_PREFIX = "speedladder_"
SDPA_HOOK = "speedladder_sdpa"  # method(): attention through F.scaled_dot_product_attention, in place
PAD_VOCAB_HOOK = "speedladder_pad_vocab"  # method(multiple): vocabulary rows grown in place to a multiple
BLOCKS_HOOK = "speedladder_blocks"  # attribute: the dotted path of the repeated blocks, when the search would miss


@dataclass(frozen=True)
class Facts:
    """What one look at a built model tells: everything a ModelDef holds beyond its family's own word."""

    convention: str  # a key of CONVENTIONS
    vocab_size: int  # the real vocabulary: the logits' width before any padding (0: not known, not needed)
    params: int  # every parameter once (a tied matrix counts once)
    blocks: str | None  # dotted path of the repeated blocks
    hooks: tuple[str, ...]  # the speedladder_* methods it defines
    dropout: str  # what was done about dropout, in words
    whole_eval: bool  # the whole model in eval mode (its randomness is outside the dropout modules)
    matmul_params: int | None  # N of the 6N rule where the family knows the architecture; None: counted by torch
    attention: tuple[int, int, int] | None  # (layers, heads, head size) of the formula's attention term


def facts(model: nn.Module, family: ModelFamily, seq_len: int, vocab: int | None,
          formula: Formula | None = None) -> Facts:
    """The facts of a model built by its family: what the family knows is taken, the rest is found by looking.

    `vocab` is the data's (None: the model's). A convention or dropout handling the family does not know is found by
    trial forwards of one sequence of seq_len tokens. `formula` is the family's FLOPs formula's terms for this
    model (ModelFamily.formula's answer); without it the FLOPs are counted by torch.
    """
    name = family.name
    if not any(p.requires_grad for p in model.parameters()):
        raise UsageError(f"{name} has no trainable parameters: there is nothing to train")
    conv, seen_vocab = ((family.convention, None) if family.convention
                        else convention(model, seq_len, name, targets=family.targets))
    vocab_size = family.vocab_size if family.vocab_size is not None else (
        seen_vocab or vocab or _embedding_rows(model))
    if not vocab_size:
        raise UsageError(f"{name} returns only a loss and has no nn.Embedding: give --vocab-size")
    blocks = find_blocks(model)
    if blocks:
        try:
            model.get_submodule(blocks)
        except AttributeError:
            raise UsageError(f"{name}.{BLOCKS_HOOK} names {blocks!r}, which is not a submodule") from None
    if family.dropout is not None:
        dropout, whole = family.dropout, False
    else:
        dropout, whole = dropout_handled(model, Adapted(model, conv, vocab_size), seq_len, name)
        if family.dropout_given and dropout == "none found":
            dropout = f"off: dropout=0.0 given to {name}"
    matmul, attention = formula or (None, None)
    return Facts(convention=conv, vocab_size=vocab_size, params=sum(p.numel() for p in model.parameters()),
                 blocks=blocks, hooks=hooks_of(model), dropout=dropout, whole_eval=whole, matmul_params=matmul,
                 attention=attention)


def find_blocks(model: nn.Module) -> str | None:
    """The dotted path of the model's repeated blocks: its hook, else the nn.ModuleList or nn.Sequential of
    same-typed modules holding the most parameters; None when there is none."""
    hinted = getattr(model, BLOCKS_HOOK, None)
    if isinstance(hinted, str):
        return hinted
    best, size = None, 0
    for name, m in model.named_modules():
        if name and isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) and len({type(c) for c in m}) == 1:
            n = sum(p.numel() for p in m.parameters())
            if n > size:
                best, size = name, n
    return best


def hooks_of(model: nn.Module) -> tuple[str, ...]:
    """The model's hook methods, by name (docs/models.md, docs/rungs.md): callables named speedladder_*."""
    return tuple(sorted(n for n in dir(type(model)) if n.startswith(HOOK_PREFIX) and callable(getattr(model, n))))


def _embedding_rows(model: nn.Module) -> int | None:
    first = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    return first.num_embeddings if first is not None else None


def accepted() -> str:
    return "; ".join(CONVENTIONS.values())


def positional(model: nn.Module) -> tuple[int, int | None]:
    """How many positional arguments forward needs, and how many it takes at most (None: any number)."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return 1, None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ps = [p for p in sig.parameters.values() if p.kind in kinds]
    if any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in sig.parameters.values()):
        return sum(p.default is p.empty for p in ps), None
    return sum(p.default is p.empty for p in ps), len(ps)


def _logits(t: Any, seq_len: int) -> int | None:
    """The vocabulary if t is logits of one sequence, (1, T, V); else None."""
    if isinstance(t, torch.Tensor) and t.ndim == 3 and tuple(t.shape[:2]) == (1, seq_len) and t.is_floating_point():
        return int(t.shape[-1])
    return None


def _scalar(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.numel() == 1 and t.is_floating_point()


def describe(out: Any) -> str:
    if isinstance(out, torch.Tensor):
        return f"a tensor of shape {tuple(out.shape)}"
    if isinstance(out, (tuple, list)):
        return f"a {type(out).__name__} of {len(out)}: " + ", ".join(describe(o) for o in out[:3])
    return f"a {type(out).__name__}"


def _with_targets(out: Any, seq_len: int) -> tuple[str, int | None] | None:
    if isinstance(out, (tuple, list)) and len(out) >= 2 and _logits(out[0], seq_len) and _scalar(out[1]):
        return "logits_loss", _logits(out[0], seq_len)
    if _scalar(out):
        return "loss", None
    return None


def _without_targets(out: Any, seq_len: int) -> tuple[str, int | None] | None:
    if _logits(out, seq_len):
        return "logits", _logits(out, seq_len)
    if _logits(getattr(out, "logits", None), seq_len):
        return "hf", _logits(out.logits, seq_len)
    return None


def convention(model: nn.Module, seq_len: int, name: str, targets: bool = True) -> tuple[str, int | None]:
    """The model's convention and the vocabulary its logits show (None for a loss-only forward).

    forward(x, y) is tried first where forward takes two arguments (nanoGPT's forward(idx, targets=None)
    returns only the last position's logits without targets), then forward(x). `targets` False tries
    forward(x) alone (a Hugging Face model's second argument is not the targets).
    """
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    x = torch.zeros(1, seq_len, dtype=torch.long, device=device)
    need, most = positional(model)
    seen = []
    tries: list[tuple[str, Callable[[], Any], Callable[[Any, int], Any]]] = []
    if targets and (most is None or most >= 2):
        tries.append(("forward(x, y)", lambda: model(x, x), _with_targets))
    if need <= 1:
        tries.append(("forward(x)", lambda: model(x), _without_targets))
    with torch.no_grad():
        for call, run, read in tries:
            try:
                out = run()
            except Exception as e:  # noqa: BLE001 -- the user's code: its error is part of the one line
                seen.append(f"{call} raised {one_line(e)}")
                continue
            found = read(out, seq_len)
            if found:
                return found
            seen.append(f"{call} returned {describe(out)}")
    raise UsageError(f"cannot tell how to call {name} on a (1, {seq_len}) batch: {'; '.join(seen) or 'no forward'}. "
                     f"Accepted: {accepted()}")


def is_random(adapted: Adapted, seq_len: int) -> bool:
    """Whether two forwards of one batch differ under different seeds: randomness the gates cannot compare."""
    device = next((p.device for p in adapted.parameters()), torch.device("cpu"))
    x = torch.zeros(1, seq_len, dtype=torch.long, device=device)
    outs = []
    with torch.no_grad():
        for seed in (1, 2):
            torch.manual_seed(seed)
            logits, loss = adapted(x, x)
            outs.append(loss if logits is None else logits)
    return not torch.equal(outs[0], outs[1])


def dropout_handled(model: nn.Module, adapted: Adapted, seq_len: int, name: str) -> tuple[str, bool]:
    """Dropout off, checked by two forwards: (what was done, in words; whether the whole model is in eval mode)."""
    active = dropout_off(model)
    if not is_random(adapted, seq_len):
        return ((f"off: {active} dropout module(s) with p > 0 switched to eval mode for measuring, gating "
                 "and training; the rest of the model stays in training mode") if active else "none found"), False
    model.eval()  # e.g. a dropout rate passed to F.scaled_dot_product_attention while self.training
    if not is_random(adapted, seq_len):
        return ("off: the whole model in eval mode for measuring, gating and training (its randomness is "
                "not only in nn.Dropout modules)"), True
    raise UsageError(f"{name} computes something different on every forward of the same batch, even in eval "
                     "mode: the gates cannot compare two runs of one step; make its forward deterministic")
