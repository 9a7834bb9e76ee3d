"""`speedladder sweep`'s records: the axis, its points (each rung's × over eager there) and each rung's crossovers.

The on-disk shape is the one the sweep wrote as plain dicts before these records: a rung measured beside eager
has "x", "x_lo" and "x_hi", one that was not has none of them (not null), and a crossover's first verdict is
"from", a word Python keeps for itself. `to_plain` and `from_plain` keep that shape both ways.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from speedladder.codec import from_fields, to_data
from speedladder.measure.judging import Spread


@dataclass
class SweepRung:
    """One rung at one point: its status and tokens/s; × over eager, its windows' range and verdict when measured
    beside eager and through its gates."""

    status: str
    detail: str = ""
    verdict: str | None = None
    passed: bool = False
    tokens_per_s: Spread | None = None
    saved_activation_bytes: int | None = None
    x: float | None = None  # the medians' ratio over eager's
    x_lo: float | None = None  # the rung's slowest window over eager's fastest
    x_hi: float | None = None  # ... its fastest over eager's slowest
    extra: dict[str, Any] = field(default_factory=dict)

    def to_plain(self) -> dict[str, Any]:
        """The saved form: x, x_lo and x_hi only where there is a ratio, as the file has always had them."""
        out = {k: v for k, v in _fields(self).items() if k not in ("x", "x_lo", "x_hi") or self.x is not None}
        return out

    @classmethod
    def from_plain(cls, data: Mapping[str, Any], where: str = "", unknown: Any = "skip") -> SweepRung:
        """The record from its saved form (the codec's rules)."""
        return from_fields(cls, data, where, unknown)


@dataclass
class SweepPoint:
    """One value of the axis: its ladder's folder, shape and each rung's record there."""

    value: int
    dir: str
    status: str
    model: dict[str, Any]  # the point's GPT config (asdict), or {"name": ...} for a model that is not ours
    batch_size: int
    seq_len: int
    rungs: dict[str, SweepRung] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def shape(self) -> str:
        """The model's width and depth, or its name when it is not our GPT."""
        m = self.model
        return f"w{m.get('n_embd')} L{m.get('n_layer')}" if "n_embd" in m else str(m.get("name", ""))


@dataclass
class Crossover:
    """Where a rung's verdict turns between two points of the axis; the points between them were inconclusive."""

    start: str  # the verdict it turns from (saved as "from")
    to: str
    after: int
    before: int
    inconclusive: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_plain(self) -> dict[str, Any]:
        """The saved form, the first verdict under "from"."""
        plain = _fields(self)
        return {"from": plain.pop("start"), **plain}

    @classmethod
    def from_plain(cls, data: Mapping[str, Any], where: str = "", unknown: Any = "skip") -> Crossover:
        """The record from its saved form."""
        renamed = {("start" if k == "from" else k): v for k, v in data.items()}
        return from_fields(cls, renamed, where, unknown)


@dataclass
class SweepSummary:
    """One rung along the axis: its verdict at each point, its crossovers, and the line that says them."""

    verdicts: list[str | None] = field(default_factory=list)
    crossovers: list[Crossover] = field(default_factory=list)
    line: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class SweepSkip:
    """A point the budget did not start, and why."""

    value: int
    detail: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class SweepSection:
    """The sweep's section of results.json: the axis and its values, the rungs, the points measured and skipped."""

    axis: str
    values: list[int]
    rungs: list[str]
    budget_minutes: float
    points: list[SweepPoint] = field(default_factory=list)
    skipped: list[SweepSkip] = field(default_factory=list)
    summary: dict[str, SweepSummary] = field(default_factory=dict)
    seconds: float | None = None  # spent so far; None until the first point is saved
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def others(self) -> list[str]:
        """The rungs measured beside eager."""
        return [r for r in self.rungs if r != "eager"]


def _fields(record: Any) -> dict[str, Any]:
    """A record's fields as the codec writes them, its extra merged in, without a record's own to_plain."""
    out = {k: to_data(v) for k, v in vars(record).items() if k != "extra"}
    out.update(to_data(record.extra))
    return out
