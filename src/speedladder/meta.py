"""What the package says of itself: its version. Low in the house, so that every package may use it."""

from __future__ import annotations

__version__ = "0.1.0"
