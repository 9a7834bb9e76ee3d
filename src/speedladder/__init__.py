"""speedladder: make transformer training fast, one measured rung at a time, and prove it."""

__version__ = "0.1.0"
