"""A model of the user's own: `--model FILE.py:NAME` or `--model package.module:NAME`, or a Python object.

NAME is an nn.Module class or a callable that returns a module. Arguments it
takes named vocab_size, block_size or seq_len get the workload's values, and
one named dropout gets 0.0 (dropout is off for measuring: docs/models.md).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from torch import nn

from speedladder.errors import UsageError, one_line
from speedladder.models.capability import Capability
from speedladder.models.definition import ModelFamily, Transform, TransformTable
from speedladder.models.detect import PAD_VOCAB_HOOK, SDPA_HOOK
from speedladder.models.float8 import float8_transforms
from speedladder.models.transforms import VOCAB_MULTIPLE, Checkpointed

LIVE = "<python object>"  # the source of a model given as an object: no other process can build it again
_FILES: dict[tuple[str, float], Any] = {}  # modules loaded from files, by path and modification time


def _load_file(path: Path) -> Any:
    if not path.is_file():
        raise UsageError(f"model file not found: {path}")
    key = (str(path), path.stat().st_mtime)
    if key not in _FILES:
        name = f"speedladder_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None  # a .py file's: the source loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look their module up by name
        if str(path.parent) not in sys.path:
            sys.path.append(str(path.parent))  # the file's own imports of its neighbours
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 -- the user's file: one line, exit 2
            raise UsageError(f"importing {path} failed: {one_line(e)}") from None
        _FILES[key] = module
    return _FILES[key]


def load(spec: str) -> Callable[..., Any]:
    """The class or callable a `--model` spec names."""
    if spec.startswith(LIVE):
        raise UsageError("the model was given as a Python object, which another process cannot build again: "
                         "give it as FILE.py:NAME or package.module:NAME")
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise UsageError(f"--model wants FILE.py:NAME or package.module:NAME, got {spec!r}")
    if where.endswith(".py"):
        module = _load_file(Path(where).expanduser().resolve())
    else:
        try:
            module = importlib.import_module(where)
        except Exception as e:  # noqa: BLE001 -- ImportError or the module's own error: one line
            raise UsageError(f"cannot import {where} for --model: {one_line(e)}") from None
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{where} has no {name!r} (--model {spec})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"--model {spec} names a {type(obj).__name__}, not an nn.Module class or a function")
    return obj


def portable(obj: Any) -> str | None:
    """A spec another process can load the object by (package.module:NAME), or None."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not isinstance(obj, type) and not inspect.isfunction(obj):
        return None
    if not module or module == "__main__" or "<" in qualname or module.startswith("speedladder_user_"):
        return None
    return f"{module}:{qualname}"


def factory_of(obj: Any, vocab: int | None, seq_len: int) -> tuple[Callable[[], nn.Module], dict[str, Any]]:
    """A zero-argument factory: a module given as an object is copied; a callable gets the workload's values."""
    if isinstance(obj, nn.Module):
        return (lambda: copy.deepcopy(obj)), {}
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        params = {}
    given: dict[str, Any] = {}
    if "vocab_size" in params and vocab:
        given["vocab_size"] = vocab
    given.update({k: seq_len for k in ("block_size", "seq_len") if k in params})
    if "dropout" in params:
        given["dropout"] = 0.0
    return functools.partial(obj, **given), given


def family(obj: Any, name: str, source: Mapping[str, Any], vocab: int | None, seq_len: int) -> ModelFamily:
    """A model of the user's own: an nn.Module (copied), a class or a function (given the workload's values); how
    to call it, its vocabulary and its dropout are found by looking (models/detect.py)."""
    factory, given = factory_of(obj, vocab, seq_len)
    return ModelFamily(kind="user", name=name, factory=factory, offers=offers, source={**source, "arguments": given},
                  dropout_given="dropout" in given)


def offers(model: nn.Module, blocks: str | None) -> TransformTable:
    """The transforms this model supports through its blocks and hooks; why the others do not apply."""
    transforms: dict[Capability, Transform] = {}
    lacks: dict[Capability, str] = {}
    if blocks:
        transforms[Capability.CHECKPOINTING] = functools.partial(checkpoint_each, path=blocks)
        transforms.update(float8_transforms(prefix=f"{blocks}."))  # each fp8 rung's, at these blocks
    else:
        lacks[Capability.BLOCKS] = ("not applicable to this model: no repeated blocks (an nn.ModuleList or "
                                    "nn.Sequential of same-typed modules holding parameters) to wrap")
    for cap, hook, args in ((Capability.SDPA, SDPA_HOOK, ()), (Capability.PAD_VOCAB, PAD_VOCAB_HOOK, (VOCAB_MULTIPLE,))):
        if callable(getattr(model, hook, None)):
            transforms[cap] = call_hook(hook, *args)
        else:
            lacks[cap] = (f"not applicable to this model: neither speedladder's GPT nor a Hugging Face model, "
                          f"and it defines no {hook}() hook (docs/models.md)")
    return TransformTable(transforms, lacks)


def checkpoint_each(model: nn.Module, path: str) -> nn.Module:
    """Activation checkpointing around each of the repeated blocks, in place: the same parameter objects."""
    blocks = cast("nn.ModuleList | nn.Sequential", model.get_submodule(path))  # what find_blocks finds
    for i, block in enumerate(blocks):
        blocks[i] = Checkpointed(block)
    return model


def call_hook(name: str, *args: Any) -> Transform:
    """A model transform that calls the model's own hook method (it changes the model in place)."""
    def apply(model: nn.Module) -> nn.Module:
        getattr(model, name)(*args)
        return model
    return apply
