"""speedladder: make transformer training fast, one measured rung at a time, and prove it."""

__version__ = "0.1.0"

__all__ = ["climb"]


def __getattr__(name: str):
    """`speedladder.climb`, imported on first use: `import speedladder` stays light (no torch)."""
    if name == "climb":
        from speedladder.api import climb

        return climb
    raise AttributeError(f"module 'speedladder' has no attribute {name!r}")
