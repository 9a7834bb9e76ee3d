"""What bench/gpu.sh prints last, and its summary.txt: read from the saved runs alone.

    python bench/summary.py [--steps STEPS.tsv] [--full SUMMARY.txt] WORK_OR_RESULTS...

Each argument is a results.json or a folder searched two levels down for them (WORK/<step>/<timestamp>/). The
full text (each run's header, notes and table; a sweep's points) goes to --full; stdout gets the plan's step
table, then each run's short table: the end of the output is what the device returns, and it is a table.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from speedladder import report
from speedladder.records import Results, RunKind, storage
from speedladder.report import race_table as race_report
from speedladder.report import sweep_curve as sweep_report

SHORT = ("rung", "tokens/s", "× prev", "pred ×", "× cum", "step ms", "MFU", "peak mem", "compile s", "gate",
         "verdict", "not built upon")
FULL = ("rung", "tokens/s", "min–max", "× prev", "pred ×", "err", "× cum", "step ms", "MFU", "TFLOP/s", "peak mem",
        "compile s", "gate", "verdict", "not built upon")
RACE = ("config", "s to target", "min–max", "× prev", "p win", "p loss", "× cum", "tok/s", "seeds", "compile s",
        "verdict")


def found(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out.extend(sorted(p.glob("*/*/results.json")) if p.is_dir() else [p])
    return out


def aligned(headers: list[str] | tuple[str, ...], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [list(headers), *rows]]


def header(saved: Results, path: Path) -> str:
    c, e = saved.config, saved.environment
    return (f"{c.preset} B={c.batch_size} T={c.seq_len} on {e.device_name}, torch "
            f"{e.torch} ({saved.status}): {path.parent.parent.name}/{path.parent.name}")


def table(saved: Results, cols: tuple[str, ...]) -> list[str]:
    if saved.run_kind is RunKind.SWEEP:
        headers, rows = sweep_report.rows(saved)
        return aligned(headers, rows)
    if saved.race is not None:
        return aligned(RACE, [[r.get(c, "—") for c in RACE] for r in race_report.race_rows(saved.race)])
    rows = report.rows(saved)
    return aligned(cols, [[r.get(c, "—") for c in cols] for r in rows])


def full_text(saved: Results, path: Path) -> list[str]:
    notes = (sweep_report.lines(saved) if saved.kind == "sweep" else race_report.race_lines(saved)
             if saved.race is not None else report.notes(saved))
    return [header(saved, path), *("  " + n for n in notes), *table(saved, FULL), ""]


def steps_table(path: Path) -> list[str]:
    with path.open() as f:
        rows = list(csv.reader(f, delimiter="\t"))
    return aligned(rows[0], rows[1:]) if rows else []


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=Path, help="the step table gpu.sh wrote (steps.tsv)")
    p.add_argument("--full", type=Path, help="write the notes and full tables here")
    p.add_argument("paths", nargs="*")
    args = p.parse_args(argv)
    runs = [(path, storage.load(path)) for path in found(args.paths)]
    if args.steps is not None and args.steps.exists():  # in the plan's order
        order = [row.split("\t")[0] for row in args.steps.read_text().splitlines()[1:]]
        runs.sort(key=lambda run: order.index(run[0].parent.parent.name) if run[0].parent.parent.name in order
                  else len(order))
    if args.full is not None:
        args.full.write_text("\n".join(line for path, saved in runs for line in full_text(saved, path)) + "\n")
    if args.steps is not None and args.steps.exists():
        print("\n".join(["", "steps (seconds):", *steps_table(args.steps)]))
    for path, saved in runs:  # the short tables last: what a reader of the tail of the log needs
        print("\n".join(["", header(saved, path), *table(saved, SHORT)]))
    if not runs:
        print("no results.json found")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
