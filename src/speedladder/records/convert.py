"""Records to and from their JSON form, by the one codec's rules (codec.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from speedladder.codec import from_data, to_data

T = TypeVar("T")


def to_dict(obj: Any) -> Any:
    """A record (or a list/dict of them) as JSON-ready data: the codec's rules, non-finite numbers as null."""
    return to_data(obj, json=True)


def from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
    """A record from its JSON form, by the codec's rules: types checked, what the record does not declare kept in
    its `extra`, a key of another version that a saved configuration no longer has skipped."""
    return from_data(cls, data, cls.__name__, unknown="skip")
