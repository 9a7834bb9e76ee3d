"""`speedladder check --baseline RUN_DIR`: speed as a CI check.

Without --against, the baseline's exact configuration is run again on this machine (`rerun_settings` reads it
from the saved config through the codec; `speedladder run --config` runs it in a fresh process, as a user would).
Then, rung by rung (aligned by name):

- a regression in speed: the new median tokens/s is below the baseline's *window minimum* by more
  than the tolerance, i.e. new_median < baseline_min * (1 - tolerance). The minimum, not the
  median: a run that stays inside the baseline's own spread is noise, not a regression;
- a gate regression: a rung whose gates passed in the baseline fails them now, or no longer runs
  (skipped, out of memory, error), or is missing; and a learns-check that passed and fails now.

Exit 1 with one line per regression; 0 with a one-line summary; 2 for bad input (UsageError).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speedladder import codec, subproc
from speedladder.cli.gen import Command
from speedladder.codec import Group
from speedladder.config import settings
from speedladder.config.settings import RaceConfig, Settings, run_from_results
from speedladder.errors import UsageError
from speedladder.records import Results, Role, from_dict, storage, to_dict
from speedladder.records.race_section import ruler_differences
from speedladder.report.compare import differences, drift_warnings
from speedladder.report.race_compare import change_test

# Roles a plain `run` reproduces; tune's combined candidates are compared only when both runs have them.
LADDER_ROLES = (Role.RUNG, Role.BESIDE, Role.CONTROL)


@dataclass(frozen=True)
class Regression:
    rung: str
    kind: str  # "speed", "gate", "not run", "missing" or "learns-check"
    detail: str  # what changed, for the one line printed
    baseline_min: float | None = None  # tokens/s: the baseline's slowest window
    new_median: float | None = None
    threshold: float | None = None  # baseline_min * (1 - tolerance)


@dataclass(frozen=True)
class Passed:
    """A rung measured in both runs that did not regress: its new median against the baseline's."""

    rung: str
    ratio: float  # new median / baseline median


def rerun_settings(saved: dict) -> tuple[str, Settings]:
    """The command and the Settings that repeat a saved run (or race) exactly: its resolved configuration through
    the codec, the race's own beside it. Nothing is re-assembled by hand, so every field (the model, its file or
    Hugging Face config, the vocabulary, the meters) comes back."""
    if saved.get("parallel"):
        raise UsageError("a predict/ddp baseline cannot be re-run by check; run it again and use --against")
    if not saved.get("config") or not saved.get("rungs") and not saved.get("race"):
        raise UsageError("the baseline has no configuration to run again: it is not a complete run's results")
    run = run_from_results(saved["config"])
    race = saved.get("race")
    if race:
        again = codec.from_data(RaceConfig, race.get("config") or {}, "race")
        if race.get("target_loss") is not None:  # the baseline's ruler: its target, not one calibrated here again
            again = dataclasses.replace(again, target_loss=race["target_loss"], target_from=None)
        return "race", Settings(run=run, race=again)
    return "run", Settings(run=run)


def own_runs(entry: dict) -> list[dict]:
    """A saved race entry's runs in the stage where it was judged (all of them in a file from before stages)."""
    runs = entry.get("runs") or []
    stage = entry.get("stage")
    return [r for r in runs if r.get("stage") == stage] if stage is not None else runs


def race_regressions(baseline: dict, new: dict, tolerance: float) -> tuple[list[Regression], list[Passed]]:
    """A race against a baseline race, configuration by configuration: one that reached the target in every seed
    there must reach it here, and its times must not be slower at the baseline's alpha (one-sided, paired by seed
    where the seeds agree) by more than the tolerance. Races on different rulers are refused (a usage error)."""
    race = baseline["race"]
    alpha = race.get("alpha") or 0.01
    differ = ruler_differences(race, new.get("race") or {}) if new.get("race") else []
    if differ:
        raise UsageError("the races were measured on different rulers (" + "; ".join(differ) + "): their times to "
                         "the target do not compare; race on the baseline's with --target-from BASELINE_DIR")
    now = {e["name"]: e for e in (new.get("race") or {}).get("entries") or []}
    out: list[Regression] = []
    held: list[Passed] = []
    for b in race.get("entries") or []:
        runs = own_runs(b)
        if b.get("status") != "ok" or not runs or any(r["stopped"] != "reached" for r in runs):
            continue  # it did not reach in the baseline: nothing to hold the new race to
        name, n = b["name"], now.get(b["name"])
        if n is None:
            out.append(Regression(name, "missing", "raced in the baseline, absent from the new race"))
            continue
        new_runs = own_runs(n)
        if n.get("status") != "ok" or not new_runs or any(r["stopped"] != "reached" for r in new_runs):
            reached = sum(r["stopped"] == "reached" for r in new_runs)
            out.append(Regression(name, "did not reach", f"reached the target in every seed in the baseline, "
                                  f"{reached} of {len(new_runs)} now ({n.get('status')}: {n.get('detail') or ''})"))
            continue
        mine, theirs = {r["seed"]: r["seconds"] for r in new_runs}, {r["seed"]: r["seconds"] for r in runs}
        ratio = statistics.fmean(mine.values()) / statistics.fmean(theirs.values())
        _, p_slower = change_test(mine, theirs, alpha) if len(mine) > 1 and len(theirs) > 1 else (1.0, 1.0)
        if p_slower < alpha and ratio > 1 + tolerance:
            out.append(Regression(name, "speed", f"{ratio:.2f}× the baseline's time to the target "
                                                 f"(p={p_slower:.2g} that it is slower; tolerance "
                                                 f"{100 * tolerance:g}%)"))
        else:
            held.append(Passed(name, 1 / ratio))
    return out, held


def _by_name(results: dict) -> dict[str, dict]:
    return {r["name"]: r for r in results.get("rungs") or []}


def regressions(baseline: dict, new: dict, tolerance: float) -> tuple[list[Regression], list[Passed]]:
    """Every regression of `new` against `baseline`, and the rungs that held up."""
    if baseline.get("race"):
        return race_regressions(baseline, new, tolerance)
    base, now = _by_name(baseline), _by_name(new)
    if not base:
        raise UsageError("the baseline has no measured rungs to check against")
    out: list[Regression] = []
    held: list[Passed] = []
    for name, b in base.items():
        if b.get("status") != "ok":
            continue  # not measured in the baseline: nothing to hold the new run to
        n = now.get(name)
        if n is None:
            if b["role"] in LADDER_ROLES or new.get("tune"):
                out.append(Regression(name, "missing", "measured in the baseline, absent from the new run"))
            continue
        if n.get("status") != "ok":
            out.append(Regression(name, "not run", f"measured in the baseline, {n.get('status')} now: {n.get('detail')}"))
            continue
        if b["gate"]["passed"] and not n["gate"]["passed"]:
            why = n["gate"].get("detail")
            out.append(Regression(name, "gate", "gate passed in the baseline, fails now" + (f": {why}" if why else "")))
        b_min, n_med = b["tokens_per_s"]["min"], n["tokens_per_s"]["median"]
        threshold = b_min * (1 - tolerance)
        if n_med < threshold:
            out.append(Regression(name, "speed", f"{n_med:,.0f} tokens/s, below the baseline's slowest window "
                                                 f"{b_min:,.0f} less {100 * tolerance:g}% ({threshold:,.0f}); "
                                                 f"{n_med / b['tokens_per_s']['median']:.2f}× its median",
                                  b_min, n_med, threshold))
        elif not any(r.rung == name for r in out):
            held.append(Passed(name, n_med / b["tokens_per_s"]["median"]))
    b_lc, n_lc = baseline.get("learns_check") or {}, new.get("learns_check") or {}
    if b_lc.get("passed") and n_lc and not n_lc.get("skipped") and not n_lc.get("passed"):
        out.append(Regression(n_lc.get("rung") or "learns-check", "learns-check",
                              f"the learns-check passed in the baseline, fails now: {n_lc.get('detail')}"))
    return out, held


def _differs(baseline: dict, new: dict) -> str:
    fields = [d.field for d in differences([from_dict(Results, baseline), from_dict(Results, new)])
              if d.field != "git commit"]
    return f" (the runs differ in {', '.join(fields)})" if fields else ""


def report(baseline: dict, new: dict, tolerance: float, label: str) -> int:
    """Print the verdict: one line per regression (exit 1), or a one-line summary (exit 0)."""
    found, held = regressions(baseline, new, tolerance)
    for r in found:
        print(f"check: regression: {r.rung}: {r.detail}")
    if found:
        print(f"check: {len(found)} regression(s) against {label}{_differs(baseline, new)}")
        return 1
    ratios = ", ".join(f"{p.rung} {p.ratio:.2f}×" for p in held)
    if baseline.get("race"):
        print(f"check: no regression against {label}: {len(held)} configuration(s) reached the target and none is "
              f"slower at p < {baseline['race'].get('alpha') or 0.01:g} by more than {100 * tolerance:g}% "
              f"(× faster than the baseline: {ratios})" + _differs(baseline, new))
        return 0
    print(f"check: no regression against {label}: {len(held)} rung(s) within {100 * tolerance:g}% of the "
          f"baseline's slowest window (new median / baseline median: {ratios}); no gate newly failing"
          + _differs(baseline, new))
    return 0


def _rerun(baseline: dict, out: str | None, quiet: bool, wide: bool = False) -> tuple[int, dict | None]:
    """Run the baseline's configuration again in a fresh process (`python -m speedladder run --config ...`), as a
    user would: nothing compiled or cached in this process carries over. Its exit code and its results. wide: the
    re-run prints every column of its rung table (a race has no rung table)."""
    command, again = rerun_settings(baseline)
    parent = Path(out) if out else Path(tempfile.mkdtemp(prefix="speedladder-check-"))
    try:
        before = set(parent.iterdir()) if parent.is_dir() else set()
        with tempfile.TemporaryDirectory(prefix="speedladder-check-config-") as tmp:
            config = settings.write(Path(tmp) / settings.CONFIG_FILE, again, "speedladder check: the baseline's",
                                    ("run", "race"))
            rc = subprocess.run([sys.executable, "-m", "speedladder", command, "--config", str(config),
                                 "--out", str(parent), *(["--quiet"] if quiet else []),
                                 *(["--wide"] if wide and command == "run" else [])], env=subproc.child_env(),
                                check=False).returncode
        made = sorted(set(parent.iterdir()) - before) if parent.is_dir() else []
        if rc != 0 or len(made) != 1:
            return rc or 1, None
        return 0, _load(made[0])
    finally:
        if out is None:  # a temporary folder: the verdict is printed, the run is not kept
            shutil.rmtree(parent, ignore_errors=True)


def _load(path: str | Path) -> dict:
    """A saved run as its file holds it (docs/results.md), whatever schema wrote it."""
    return to_dict(storage.load(path))


def cmd_check(s: Settings, _: argparse.Namespace) -> int:
    c = s.check
    baseline = _load(c.require_baseline())
    new: dict[str, Any] | None
    if c.against:
        new = _load(c.against)
    else:
        rerun_settings(baseline)  # a baseline that cannot be re-run is bad input: say so before measuring anything
        rc, new = _rerun(baseline, c.keep, s.quiet, s.wide)
        if new is None:
            return rc
    typed = [from_dict(Results, baseline), from_dict(Results, new)]
    for line in drift_warnings(typed, ["the baseline", "the new run"], c.drift_limit):
        print(f"check: {line}")
    return report(baseline, new, c.tolerance, str(c.baseline))


COMMANDS = (
    Command("check", "fail (exit 1) when a run is slower than a baseline or a gate newly fails",
            "Run the baseline's configuration again here (or read --against) and exit 1 when a rung's median "
            "tokens/s falls below the baseline's slowest window by more than the tolerance, or a gate that passed now "
            "fails; one line per regression. A race is held to its baseline's times to the target. Exit 0 with a "
            "one-line summary otherwise, 2 for a missing or invalid baseline.", (Group.CHECK, Group.QUIET, Group.WIDE),
            cmd_check),
)
