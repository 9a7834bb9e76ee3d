"""The rung API: the one way to declare a technique, used by every built-in rung and by a user's own (docs/rungs.md).

A rung has a name, a one-line reason, a kind, and what it changes: the step specification (a function of the spec
and the machine, or fields to set), the model (a function nn.Module -> nn.Module, applied to a freshly built
model), or the optimizer (a factory from the named parameters and the learning rate). Its requirement says what it
needs of the machine and the model, and is checked before anything is built; a rung that cannot run is skipped
with that reason. Declared with the decorator `@rung(...)` or in one call, `rung.define(...)`, it lands in RUNGS, the
one registry every command reads; the other tables (MODEL_TRANSFORMS, OPTIMIZERS, ...) are indexes computed from it.

    import speedladder

    @speedladder.rung("fused-gelu", "GELU and its bias in one kernel", kind="speed")
    def fused_gelu(model):
        ...
        return model
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import torch
from torch import nn

from speedladder.errors import RungError, one_line
from speedladder.models.gpt import GPTConfig
from speedladder.spec import Capability, StepSpec

# What each kind of rung is, and so which gates judge it (gates.py, docs/rungs.md).
KINDS: dict[str, str] = {
    "speed": "computes the same function faster: every gate applies",
    "memory": "the same function for less memory, expected to cost speed: every gate applies",
    "optimizer": "changes how the model learns: the causality probe, tokens to AdamW's loss, the learns-check and "
                 "the race judge it",
    "architecture": "changes the function by design: the causality probe, the learns-check and the race judge it",
}
CHANGES_FUNCTION = ("optimizer", "architecture")  # the equivalence gates do not apply to these: they differ by design
BUILT_IN = "built-in"




class ModelFacts(Protocol):
    """What a rung's requirement reads of the model; a models.ModelDef is one (the rungs sit below the models)."""

    @property
    def lacks(self) -> Mapping[Capability, str]: ...  # why, for each capability the model lacks

    @property
    def hooks(self) -> tuple[str, ...]: ...  # its speedladder_* methods

    @property
    def shapes(self) -> GPTConfig | None: ...  # its architecture in our GPT's terms, where known


@dataclass(frozen=True)
class Env:
    """What a rung may depend on: the machine, the model and the workload's knobs."""

    device_type: str  # "cuda", "mps" or "cpu"
    cuda_capability: tuple[int, int] | None
    batch_multiplier: int
    batch_lr_scale: str = "none"  # the batch rung's learning-rate rule (config.BATCH_LR_SCALES)
    # The model, read where a requirement asks (None: one that lacks nothing and defines no hooks, shape unknown).
    model: ModelFacts | None = field(default=None, compare=False)
    base_batch: int | None = None  # the workload's batch: the accum rung's micro-batch count starts from it
    accum_steps: int | None = None  # the recipe's micro-steps for the accum rung (None: batch_multiplier)


@dataclass(frozen=True)
class Requirement:
    """What a rung needs; `unmet` says why it cannot run here, or None."""

    devices: tuple[str, ...] = ("cuda", "mps", "cpu")
    min_capability: tuple[int, int] | None = None  # CUDA compute capability
    compiler: bool = False  # inductor's code generator: Triton on CUDA, a C++ compiler on CPU
    modules: tuple[str, ...] = ()  # optional packages, by import name
    install: str | None = None  # how to get them
    model: Capability | None = None  # what it needs of the model, e.g. Capability.BLOCKS (models/ say which they lack)
    hooks: tuple[str, ...] = ()  # methods the model must define, e.g. "speedladder_qk_norm" (docs/rungs.md)
    # The model's shape, in our GPT's terms: a function answering why it does not fit, or None when it does
    # (checked where the shape is known: our GPT, Hugging Face GPT-2).
    shape: Callable[[GPTConfig], str | None] | None = None

    def unmet(self, env: Env) -> str | None:
        if env.device_type not in self.devices:
            return f"needs {' or '.join(self.devices)}; this device is {env.device_type}"
        if self.min_capability and env.device_type == "cuda":
            cap = env.cuda_capability or (0, 0)
            if cap < self.min_capability:
                want = ".".join(map(str, self.min_capability))
                return f"needs CUDA compute capability >= {want}; this GPU is {cap[0]}.{cap[1]}"
        model = env.model
        lacks = model.lacks.get(self.model.needs) if self.model and model else None
        if lacks:
            return lacks
        missing_hooks = [h for h in self.hooks if h not in (model.hooks if model else ())]
        if missing_hooks:
            return (f"not applicable to this model: it defines no {missing_hooks[0]}() hook (speedladder's GPT "
                    "does; docs/rungs.md)")
        shape = model.shapes if model else None
        if self.shape is not None and shape is not None:  # known for our GPT and GPT-2; else the hook's
            why = self.shape(shape)
            if why:
                return f"not applicable to this model: {why}"
        missing = [m for m in self.modules if importlib.util.find_spec(m) is None]
        if missing:
            return f"needs {', '.join(missing)}, not installed" + (f": {self.install}" if self.install else "")
        if self.compiler:
            if env.device_type == "cuda" and importlib.util.find_spec("triton") is None:
                return "torch.compile on CUDA needs Triton, which is not installed"
            if env.device_type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
                return "torch.compile on a CPU needs a C++ compiler (g++ or clang++), none found"
        return None

    def to_dict(self) -> dict[str, Any]:
        """What results.json records of it (a shape check is a function: its name)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "shape"}
        d["shape"] = getattr(self.shape, "__name__", "a check") if self.shape else None
        return d


SpecChange = Callable[[StepSpec, Env], StepSpec] | Mapping[str, Any]
# Any: a transform takes the model it was written for (the built-in ones our GPT), not every nn.Module.
ModelTransform = Callable[[Any], nn.Module]
# (named parameters under their reference names, learning rate) -> an optimizer with step() and zero_grad().
OptimizerFactory = Callable[[dict[str, nn.Parameter], float], Any]


@dataclass(frozen=True)
class Rung:
    name: str
    reason: str  # one line: why it should pay
    kind: str  # a key of KINDS
    transform: Callable[[StepSpec, Env], StepSpec]  # the spec it gives, composed from what it declared
    requires: Requirement = Requirement()
    # A batch-changing rung also measures this variant of its spec, like with like (docs/measurement.md, rule 6).
    control: Callable[[StepSpec], StepSpec] | None = None
    control_reason: str | None = None
    model: ModelTransform | None = None  # registered in MODEL_TRANSFORMS under `transform_name`
    transform_name: str | None = None
    optimizer: OptimizerFactory | None = None  # registered in OPTIMIZERS under the rung's name
    changes_params: bool = False  # its model transform makes new parameters (an architecture rung may always)
    source: str = BUILT_IN  # where it was declared: built-in, or the user's file or module


# The one registry: every rung, built-in or the user's, as declared through rung().
RUNGS: dict[str, Rung] = {}

V = TypeVar("V")


class RungIndex(Mapping[str, V]):
    """A read-only index of RUNGS, computed from it at each read: nothing to keep in step when a rung goes."""

    def __init__(self, index: Callable[[], dict[str, V]]) -> None:
        self._index = index

    def __getitem__(self, name: str) -> V:
        return self._index()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._index())

    def __len__(self) -> int:
        return len(self._index())


def _with_transforms() -> Iterator[tuple[str, Rung]]:
    """(transform name, rung) for each rung with a model transform; a later rung's wins a name."""
    return ((r.transform_name, r) for r in RUNGS.values() if r.model is not None and r.transform_name)


# Model transforms by name (StepSpec.transforms): each rung's own, under its transform name.
MODEL_TRANSFORMS: Mapping[str, ModelTransform] = RungIndex(
    lambda: {t: _checked(r.name, r.source, r.model) for t, r in _with_transforms() if r.model is not None})
# A transform's kind (the rung that declared it).
TRANSFORM_KINDS: Mapping[str, str] = RungIndex(lambda: {t: r.kind for t, r in _with_transforms()})
# The transforms that may make new parameters (an architecture rung's always may), as a set of names.
NEW_PARAMS: Mapping[str, bool] = RungIndex(
    lambda: {t: True for t, r in _with_transforms() if r.changes_params or r.kind == "architecture"})
# Optimizers that rungs bring, by name (StepSpec.optimizer); AdamW's and Muon are step/train_step.py's own.
OPTIMIZERS: Mapping[str, OptimizerFactory] = RungIndex(
    lambda: {r.name: r.optimizer for r in RUNGS.values() if r.optimizer is not None})
_SOURCE = [BUILT_IN]  # who is declaring now: a user's rung file while it is loaded (rungs/files.py)


@contextmanager
def declaring(source: str) -> Iterator[list[str]]:
    """Rungs declared inside are the given source's; yields the names declared."""
    before = set(RUNGS)
    _SOURCE.append(source)
    names: list[str] = []
    try:
        yield names
    finally:
        _SOURCE.pop()
        names.extend(n for n in RUNGS if n not in before)


def _checked(name: str, source: str, fn: ModelTransform) -> ModelTransform:
    """A user's model transform whose failure names the rung (a built-in one fails as itself)."""
    if source == BUILT_IN:
        return fn

    def transform(model: nn.Module) -> nn.Module:
        try:
            out = fn(model)
        except Exception as e:
            raise RungError(f"rung {name}'s model transform raised {one_line(e)}") from e
        if not isinstance(out, nn.Module):
            raise RungError(f"rung {name}'s model transform returned a {type(out).__name__}, not the nn.Module")
        return out
    return transform


def _spec_of(name: str, spec: SpecChange | None, model: ModelTransform | None, transform_name: str,
             optimizer: OptimizerFactory | None, source: str) -> Callable[[StepSpec, Env], StepSpec]:
    fields = dict(spec) if isinstance(spec, Mapping) else None
    if fields is not None:
        unknown = sorted(set(fields) - set(StepSpec.__dataclass_fields__))
        if unknown:
            raise RungError(f"rung {name}: unknown step field {unknown[0]!r} (fields: "
                            f"{', '.join(StepSpec.__dataclass_fields__)})")

    def transform(s: StepSpec, e: Env) -> StepSpec:
        if fields is not None:
            s = dataclasses.replace(s, **fields)
        elif spec is not None and not isinstance(spec, Mapping):  # (a Mapping is `fields`)
            try:
                s = spec(s, e)
            except Exception as err:
                if source == BUILT_IN:
                    raise
                raise RungError(f"rung {name}'s spec transform raised {one_line(err)}") from err
        if model is not None:
            s = dataclasses.replace(s, transforms=(*s.transforms, transform_name))
        if optimizer is not None:
            s = dataclasses.replace(s, optimizer=name)
        return s
    return transform


F = TypeVar("F", bound=Callable[..., Any])


class RungDeclarer:
    """`speedladder.rung`: `@rung(...)` declares a rung around the function it decorates, `rung.define(...)` declares
    one in a call. Two forms, each typed: a decorator never returns a Rung, a call never returns a decorator."""

    def __call__(self, name: str, reason: str, kind: str = "speed", *, requires: Requirement | None = None,
                 control: Callable[[StepSpec], StepSpec] | None = None, control_reason: str | None = None,
                 changes_params: bool = False, transform: str | None = None,
                 on: str = "model", **given: object) -> Callable[[F], F]:
        """A decorator declaring the rung whose model transform (on="model", the default), spec transform
        (on="spec") or optimizer factory (on="optimizer") is the decorated function, which is returned unchanged.
        The other arguments are `define`'s. `given`: only to name the call form to a file written for it."""
        if unknown := sorted(set(given) - {"spec", "model", "optimizer"}):
            raise RungError(f"rung {name}: unknown argument {', '.join(unknown)} to speedladder.rung")
        if given:  # spec=, model= or optimizer= given to the decorator: a rung declared in one call
            raise RungError(f"rung {name}: speedladder.rung(...) is the decorator; declare a rung in one call, with "
                            f"{', '.join(f'{k}=' for k in given)}, as speedladder.rung.define(...) (docs/rungs.md)")
        if on not in ("model", "spec", "optimizer"):
            raise RungError(f"rung {name}: on must be model, spec or optimizer, got {on!r}")

        def decorate(fn: F) -> F:
            self.define(name, reason, kind, requires=requires, control=control, control_reason=control_reason,
                        changes_params=changes_params, transform=transform,
                        spec=fn if on == "spec" else None, model=fn if on == "model" else None,
                        optimizer=fn if on == "optimizer" else None)
            return fn
        return decorate

    @staticmethod
    def define(name: str, reason: str, kind: str = "speed", *, spec: SpecChange | None = None,
               model: ModelTransform | None = None, optimizer: OptimizerFactory | None = None,
               requires: Requirement | None = None, control: Callable[[StepSpec], StepSpec] | None = None,
               control_reason: str | None = None, changes_params: bool = False, transform: str | None = None) -> Rung:
        """Declare a rung and register it in RUNGS; the Rung.

        kind: "speed", "memory", "optimizer" or "architecture" (KINDS). spec: fields of the StepSpec to set, or a
        function (spec, env) -> spec. model: nn.Module -> nn.Module, on a freshly built model, keeping its parameter
        objects unless `changes_params` (an architecture rung may always make new ones). optimizer: (named
        parameters, learning rate) -> an optimizer. requires: what it needs (Requirement). transform: the name its
        model transform goes by in StepSpec.transforms (the rung's own name by default).
        """
        source = _SOURCE[-1]
        if kind not in KINDS:
            raise RungError(f"rung {name}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if not name or any(c in name for c in ",+ =") or name != name.strip():
            raise RungError(f"rung name {name!r}: a name without spaces, commas, '+' or '=' is needed")
        if not reason.strip() or "\n" in reason.strip():
            raise RungError(f"rung {name}: the reason is one line saying why it should pay")
        if name in RUNGS:
            raise RungError(f"rung {name!r} ({source}) is already defined ({RUNGS[name].source}): choose another "
                            "name")
        tname = str(transform or name)  # a Capability's value: StepSpec.transforms holds plain names
        if model is not None and tname in MODEL_TRANSFORMS:
            raise RungError(f"rung {name}: a model transform named {tname!r} exists already")
        RUNGS[name] = Rung(name=name, reason=reason.strip(), kind=kind,
                           transform=_spec_of(name, spec, model, tname, optimizer, source),
                           requires=requires or Requirement(), control=control, control_reason=control_reason,
                           model=model, transform_name=tname if model is not None else None, optimizer=optimizer,
                           changes_params=changes_params, source=source)
        return RUNGS[name]


rung = RungDeclarer()
define = rung.define


def unregister(name: str) -> None:
    """Forget a rung (tests; a rung file loaded again after a change): the indexes above are read from RUNGS."""
    RUNGS.pop(name, None)


def architecture(spec: StepSpec) -> tuple[str, ...]:
    """The model transforms of a spec that architecture rungs brought: the function it computes, as eager would."""
    return tuple(t for t in spec.transforms if TRANSFORM_KINDS.get(t) == "architecture")


def compose(names: tuple[str, ...], spec: StepSpec, env: Env) -> StepSpec:
    """The spec that the named rungs give when each is applied to the last, with no gates in between."""
    for name in names:
        spec = RUNGS[name].transform(spec, env)
    return spec


def kind_of(names: tuple[str, ...] | list[str]) -> str:
    """The kind of rungs applied together: the one that changes the most (architecture, optimizer, memory,
    speed), so that a combination is judged as its most far-reaching rung is."""
    kinds = {RUNGS[n].kind for n in names if n in RUNGS}
    return next((k for k in ("architecture", "optimizer", "memory") if k in kinds), "speed")


def lr_factor(rule: str, multiplier: int) -> float:
    """The learning rate's factor for a batch K times bigger: none 1, sqrt sqrt(K), linear K."""
    return {"none": 1.0, "sqrt": math.sqrt(multiplier), "linear": float(multiplier)}[rule]


def env_for(device: torch.device, batch_multiplier: int, batch_lr_scale: str = "none",
            model: ModelFacts | None = None, base_batch: int | None = None, accum_steps: int | None = None) -> Env:
    """The Env of a device and a model."""
    cap = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    return Env(device.type, cap, batch_multiplier, batch_lr_scale=batch_lr_scale, model=model,
               base_batch=base_batch, accum_steps=accum_steps)
