"""speedladder: make transformer training fast, one measured rung at a time, and prove it."""

__version__ = "0.1.0"

__all__ = ["apply", "climb", "race"]


def __getattr__(name: str):
    """`speedladder.climb`, `.race` and `.apply`, imported on first use: `import speedladder` stays light (no torch)."""
    if name in __all__:
        from speedladder import api

        return getattr(api, name)
    raise AttributeError(f"module 'speedladder' has no attribute {name!r}")
