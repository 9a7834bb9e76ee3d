"""speedladder: make transformer training fast, one measured rung at a time, and prove it."""

from __future__ import annotations

from speedladder.meta import __version__ as __version__

__all__ = ["Capability", "Requirement", "StepSpec", "apply", "climb", "race", "rounding_fuzz", "rung"]
_RUNG_API = ("Capability", "Requirement", "StepSpec", "rounding_fuzz", "rung")  # declaring a rung of your own (docs/rungs.md)


def __getattr__(name: str):
    """`speedladder.climb`, `.race`, `.apply` and the rung API, imported on first use: `import speedladder` stays
    light (no torch)."""
    if name in _RUNG_API:
        from speedladder import rungs

        return getattr(rungs, name)
    if name in __all__:
        from speedladder import api

        return getattr(api, name)
    raise AttributeError(f"module 'speedladder' has no attribute {name!r}")
