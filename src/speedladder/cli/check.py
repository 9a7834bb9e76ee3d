"""`speedladder check --baseline RUN_DIR`: speed as a CI check.

Without --against, the baseline's exact configuration is run again on this machine (`rerun_argv`
builds the `speedladder run` arguments from the saved config, run in a fresh process as a user would). Then,
rung by rung (aligned by name):

- a regression in speed: the new median tokens/s is below the baseline's *window minimum* by more
  than the tolerance, i.e. new_median < baseline_min * (1 - tolerance). The minimum, not the
  median: a run that stays inside the baseline's own spread is noise, not a regression;
- a gate regression: a rung whose gates passed in the baseline fails them now, or no longer runs
  (skipped, out of memory, error), or is missing; and a learns-check that passed and fails now.

Exit 1 with one line per regression; 0 with a one-line summary; 2 for bad input (UsageError).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from speedladder import results, subproc
from speedladder.cli.flags import command
from speedladder.config import LADDERS
from speedladder.errors import UsageError
from speedladder.records import to_dict
from speedladder.report.compare import differences

DEFAULT_TOLERANCE = 0.05
# Roles a plain `run` reproduces; tune's combined candidates are compared only when both runs have them.
LADDER_ROLES = ("rung", "beside", "control")


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


def rerun_argv(saved: dict) -> list[str]:
    """The `speedladder run` arguments that repeat a saved run's configuration exactly."""
    if saved.get("parallel"):
        raise UsageError("a predict/ddp baseline cannot be re-run by check; run it again and use --against")
    try:
        c = saved["config"]
        g, prof = c["gates"], c["profile"]
        argv = ["run", "--preset", c["preset"], "--data", c["data"], "--tokenizer", c["tokenizer"],
                "--batch-size", str(c["batch_size"]), "--seq-len", str(c["seq_len"]),
                "--batch-multiplier", str(c["batch_multiplier"]), "--device", c["device"],
                "--lr", repr(c["lr"]), "--seed", str(c["seed"]),
                "--steps", str(c["steps"]), "--windows", str(c["windows"]), "--warmup", str(c["warmup"]),
                "--max-warmup", str(c["max_warmup"]),
                "--loss-steps", str(g["loss_steps"]), "--loss-band", repr(g["loss_band"]),
                "--learns-steps", str(g["learns_steps"]), "--learns-band", repr(g.get("learns_band", 0.03)),
                "--target-steps", str(g["target_steps"]), "--profile-steps", str(prof["steps"])]
        rungs, beside = tuple(c["rungs"]), tuple(c.get("beside") or ())
    except (KeyError, TypeError) as e:
        raise UsageError(f"the baseline's config has no {e}: it is not a complete run's results") from None
    ladder = LADDERS.get(c.get("ladder") or "")
    if ladder is not None and (ladder.rungs, ladder.beside) == (rungs, beside):
        argv += ["--ladder", c["ladder"]]  # a named ladder keeps its beside rungs, which --rungs would drop
    else:
        argv += ["--rungs", ",".join(rungs)]
    peak = c.get("peak_tflops")
    if isinstance(peak, (int, float)):  # schema 1: one number for every precision
        peak = {"fp32": peak, "tf32": peak, "bf16": peak, "fp8": peak}
    if peak:
        argv += ["--peak-tflops", ",".join(f"{k}={v!r}" for k, v in peak.items())]
    if not prof.get("enabled", True):
        argv.append("--no-profile")
    return argv


def race_argv(saved: dict) -> list[str]:
    """The `speedladder race` arguments that repeat a saved race: its workload, configurations and rule."""
    race = saved["race"]
    argv = ["race", *_workload_argv(saved["config"])]
    entries = race.get("entries") or []
    if any(e["role"] in ("combo", "winner") for e in entries):
        argv += ["--combos", ",".join("+".join(e["rungs"]) for e in entries if e["role"] in ("combo", "winner"))]
    else:
        argv += ["--rungs", ",".join(e["name"] for e in entries)]
    argv += ["--seeds", str(len(race["seeds"])), "--eval-every", str(race["eval_every"]),
             "--calibrate-steps", str(race["calibrate_steps"]), "--alpha", repr(race["alpha"]),
             "--detect", repr(race["detect"]), "--val-sequences", str(race["val_sequences"])]
    if race.get("target_from") == "--target-loss":
        argv += ["--target-loss", repr(race["target_loss"])]
    if race.get("cap_from") == "--time-cap":
        argv += ["--time-cap", repr(race["time_cap_s"])]
    return argv


def _workload_argv(c: dict) -> list[str]:
    """The model, data and shape flags of a saved config (a race's: no timing, gates or profile)."""
    argv = ["--preset", c["preset"], "--data", c["data"], "--tokenizer", c["tokenizer"],
            "--batch-size", str(c["batch_size"]), "--seq-len", str(c["seq_len"]),
            "--batch-multiplier", str(c["batch_multiplier"]), "--device", c["device"], "--lr", repr(c["lr"]),
            "--seed", str(c["seed"]), "--warmup", str(c["warmup"]), "--max-warmup", str(c["max_warmup"]),
            "--batch-lr-scale", c.get("batch_lr_scale") or "none"]
    if c.get("val_data"):
        argv += ["--val-data", c["val_data"]]
    return argv


def race_regressions(baseline: dict, new: dict, tolerance: float) -> tuple[list[Regression], list[Passed]]:
    """A race against a baseline race, configuration by configuration: one that reached the target in every seed
    there must reach it here, and its times must not be slower at the baseline's alpha (Welch, one-sided) by more
    than the tolerance."""
    from speedladder import stats

    race = baseline["race"]
    alpha = race.get("alpha") or 0.01
    now = {e["name"]: e for e in (new.get("race") or {}).get("entries") or []}
    out: list[Regression] = []
    held: list[Passed] = []
    for b in race.get("entries") or []:
        runs = b.get("runs") or []
        if b.get("status") != "ok" or not runs or any(r["stopped"] != "reached" for r in runs):
            continue  # it did not reach in the baseline: nothing to hold the new race to
        name, n = b["name"], now.get(b["name"])
        if n is None:
            out.append(Regression(name, "missing", "raced in the baseline, absent from the new race"))
            continue
        new_runs = n.get("runs") or []
        if n.get("status") != "ok" or not new_runs or any(r["stopped"] != "reached" for r in new_runs):
            reached = sum(r["stopped"] == "reached" for r in new_runs)
            out.append(Regression(name, "did not reach", f"reached the target in every seed in the baseline, "
                                  f"{reached} of {len(new_runs)} now ({n.get('status')}: {n.get('detail') or ''})"))
            continue
        mine, theirs = [r["seconds"] for r in new_runs], [r["seconds"] for r in runs]
        ratio = (sum(mine) / len(mine)) / (sum(theirs) / len(theirs))
        w = stats.welch(mine, theirs, alpha) if len(mine) > 1 and len(theirs) > 1 else None
        if w is not None and w.p_greater < alpha and ratio > 1 + tolerance:
            out.append(Regression(name, "speed", f"{ratio:.2f}× the baseline's time to the target "
                                                 f"(p={w.p_greater:.2g} that it is slower; tolerance "
                                                 f"{100 * tolerance:g}%)"))
        else:
            held.append(Passed(name, 1 / ratio))
    return out, held


def _by_name(results: dict) -> dict[str, dict]:
    return {r["name"]: r for r in results.get("rungs") or []}


def regressions(baseline: dict, new: dict, tolerance: float) -> tuple[list[Regression], list[Passed]]:
    """Every regression of `new` against `baseline`, and the rungs that held up."""
    if not 0 <= tolerance < 1:
        raise UsageError(f"the tolerance must be at least 0 and below 1, got {tolerance}")
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
    fields = [d.field for d in differences([baseline, new]) if d.field != "git commit"]
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


def _rerun(baseline: dict, out: str | None, quiet: bool) -> tuple[int, dict | None]:
    """Run the baseline's configuration again in a fresh process (`python -m speedladder run ...`), as a user
    would: nothing compiled or cached in this process carries over. Its exit code and its results."""
    argv = race_argv(baseline) if baseline.get("race") else rerun_argv(baseline)
    parent = Path(out) if out else Path(tempfile.mkdtemp(prefix="speedladder-check-"))
    try:
        before = set(parent.iterdir()) if parent.is_dir() else set()
        rc = subprocess.run([sys.executable, "-m", "speedladder", *argv, "--out", str(parent),
                             *(["--quiet"] if quiet else [])], env=subproc.child_env(),
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
    return to_dict(results.load(path))


def add_commands(sub) -> None:
    p = command(sub, "check")
    p.add_argument("--baseline", required=True, metavar="RUN_DIR",
                   help="the run folder (or results.json) to hold this machine to. Default: none, it is required")
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, metavar="F",
                   help="allowed fraction below the baseline's slowest window. Default: %(default)s")
    p.add_argument("--against", metavar="NEW_RUN_DIR",
                   help="compare this existing run instead of running the baseline's configuration again. "
                        "Default: run it again")
    p.add_argument("--out", metavar="DIR",
                   help="keep the new run in DIR/<timestamp>/. Default: a temporary folder, removed afterwards")
    p.add_argument("--quiet", action="store_true", help="no progress lines from the new run on stderr")


def cmd_check(args: argparse.Namespace) -> int:
    if not 0 <= args.tolerance < 1:
        raise UsageError(f"the tolerance must be at least 0 and below 1, got {args.tolerance}")
    if args.against and args.out:
        raise UsageError("--out keeps the re-run; with --against nothing is run")
    baseline = _load(args.baseline)
    if args.against:
        new = _load(args.against)
    else:
        # a baseline that cannot be re-run is bad input: say so before measuring anything
        race_argv(baseline) if baseline.get("race") else rerun_argv(baseline)
        rc, new = _rerun(baseline, args.out, args.quiet)
        if new is None:
            return rc
    return report(baseline, new, args.tolerance, str(args.baseline))
