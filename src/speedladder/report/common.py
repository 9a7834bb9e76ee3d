"""What every report shares: labels and number formats."""

from __future__ import annotations

import sys

from rich.console import Console

from speedladder.config.resolved import Resolved
from speedladder.ladder import builds_on
from speedladder.records import Results, Role, RungResult, SavedModel

STATUS_LABEL = {"skipped": "skipped", "oom": "OOM", "error": "error", "interrupted": "interrupted",
                "pending": "interrupted"}


def console() -> Console:
    # Wide enough for every column when the output is piped to a file (rich would assume 80).
    return Console(highlight=False, width=None if sys.stdout.isatty() else 240)


def gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def times(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}×"


def label(r: RungResult) -> str:
    if r.role == Role.CONTROL:
        return f"└ {r.rung} fp32 control"
    if r.role == Role.BESIDE and r.ok:
        return f"┊ {r.name} beside {r.built_on or 'the top'}"
    if r.role == Role.CANDIDATE:
        return f"◆ {r.name}"
    if r.role == Role.FINAL:  # tune's finalist, measured again beside eager
        return f"★ {r.name}"
    return r.name


def not_built_upon(r: RungResult) -> str:
    """Why the rungs above do not build on a rung of the ladder, in a word, or "" when they do (or when the row is
    no step of the ladder: a control, a tune candidate). One word, one meaning, wherever it is shown:
    slower: it passed its gates and its speed did not pay (a loss, red on the waterfall);
    race: an optimizer or architecture rung, judged by time to a target loss, not by tokens/s;
    gate: it failed a gate (whatever its speed); skipped, OOM, error, interrupted: it did not run to the end;
    beside: measured on the top of the ladder by design (a memory rung), never a base."""
    if r.role not in (Role.RUNG, Role.BESIDE):
        return ""
    if not r.ok:
        return STATUS_LABEL.get(r.status, r.status)
    if r.gate is not None and not r.gate.passed:
        return "gate"
    if r.role == Role.BESIDE:
        return "beside"
    return builds_on.word(r) if r.not_built_upon else ""


def model_label(config: Resolved, model: SavedModel | None) -> str:
    """The preset for our GPT (and in files from before other models); the model's name otherwise."""
    return config.preset if model is None or model.kind == "speedladder" else model.name


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def recipe_part(results: Results) -> str:
    """What a title adds where a run was not trained as speedladder always trained: the recipe's name (and that its
    values were changed), and the CPU threads when --threads set them."""
    run = results.config.run
    recipe = run.recipe
    parts = [] if recipe.is_default else [f"recipe {recipe.name}" + (" (changed)" if recipe.changes() else "")]
    if run.threads is not None:
        parts.append(f"{run.threads} thread{'' if run.threads == 1 else 's'}")
    return "".join(f" · {p}" for p in parts)


def recipe_line(results: Results) -> list[str]:
    """The notes' line on the recipe and its schedule, where it is not the default."""
    recipe = results.config.run.recipe
    if recipe.is_default:
        return []
    return [f"recipe: {recipe.describe()}" + (f"; schedule: {results.schedule}" if results.schedule else "") + "."]


def scale_label(scale: str, device_type: str | None) -> str:
    """A gate's scale as saved ("eager bf16 (emulated)") named for the device it ran on: eager at a lower precision
    is always eager fp32 with that precision's rounding emulated (verify/emulate.py, rule 12), as autocast on that
    device rounds: on a GPU, CUDA's policy; on a CPU, a CPU's."""
    where = {"cuda": "autocast on CUDA", "cpu": "autocast on a CPU"}.get(device_type or "", "")
    out = scale
    for precision in ("bf16", "fp16", "tf32", "fp8"):
        out = out.replace(f"eager {precision} (emulated)",
                          f"eager at {precision} ({where}, emulated)" if where else f"eager at {precision} (emulated)")
    return out
