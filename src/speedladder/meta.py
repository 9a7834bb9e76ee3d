"""What the package says of itself: its version, and the old module names it still answers to, for one release
(the modules that moved into folders by concern). Low in the house, so that every package may use it."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.1.0"

# The modules that moved into folders, by their old names: `import speedladder.gates` still works, for one release,
# and gives the very module `speedladder.verify.gates` (so a test that patches one patches the other).
# `speedladder.config`, `.verify` and `.measure` kept their names as packages: their __init__ hands on the names.
MOVED = {
    "speedladder.codec": "speedladder.config.codec",
    "speedladder.gates": "speedladder.verify.gates",
    "speedladder.ladder": "speedladder.climbing.ladder",
    "speedladder.ladders": "speedladder.config.ladders",
    "speedladder.memory": "speedladder.climbing.meters",
    "speedladder.optim": "speedladder.rungs.optim",
    "speedladder.parallel.config": "speedladder.config.parallel",
    "speedladder.presets": "speedladder.config.presets",
    "speedladder.probes": "speedladder.verify.probes",
    "speedladder.processor": "speedladder.measure.processor",
    "speedladder.settings": "speedladder.config.commands",
    "speedladder.stats": "speedladder.measure.stats",
    "speedladder.sweep": "speedladder.climbing.sweep",
    "speedladder.train": "speedladder.training.train",
    "speedladder.truth": "speedladder.verify.truth",
    "speedladder.tune": "speedladder.climbing.tune",
    "speedladder.winner": "speedladder.training.winner",
}


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name of MOVED; its loader imports the new module and hands on that same object."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name not in MOVED:
            return None
        module = importlib.import_module(MOVED[name])
        return importlib.machinery.ModuleSpec(name, self, loader_state=(module, module.__spec__))

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return spec.loader_state[0]

    def exec_module(self, module: types.ModuleType) -> None:
        old_spec = module.__spec__  # the import system set the old name's spec on the module: put its own back
        if old_spec is not None:
            module.__spec__ = old_spec.loader_state[1]


def install() -> None:
    """Answer the old names (speedladder/__init__.py calls this once on import)."""
    if not any(isinstance(finder, _Moved) for finder in sys.meta_path):
        sys.meta_path.append(_Moved())


class _HandsOn(types.ModuleType):
    """A package that hands on its modules' names: setting one on it (a test's monkeypatch) sets it in each of its
    modules that holds it, so that the code reading it there sees it."""

    def __setattr__(self, name: str, value: object) -> None:
        for module in self.__dict__.get("_holders", {}).get(name, ()):
            setattr(module, name, value)
        super().__setattr__(name, value)


def hand_on(package: str, *modules: str) -> None:
    """Give `package` the public names of its `modules` (what the one module of that name held before it became a
    package), for one release; code inside speedladder imports them from the modules themselves."""
    pkg = sys.modules[package]
    loaded = [importlib.import_module(f"{package}.{m}") for m in modules]
    holders: dict[str, list[types.ModuleType]] = {}
    for module in loaded:
        for name, value in vars(module).items():
            if name.startswith("_") or isinstance(value, types.ModuleType):
                continue
            if name not in pkg.__dict__:
                pkg.__dict__[name] = value
            if pkg.__dict__[name] is value:
                holders.setdefault(name, []).append(module)
    pkg.__dict__["_holders"] = holders
    pkg.__class__ = _HandsOn
