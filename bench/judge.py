"""How often `speedladder judge` keeps what it should not, keeps what it should, and what a decision costs.

Judges each candidate (a rung file) several times, each trial on seeds of its own, one judgement at a time, and
prints one Markdown table: per candidate the decisions, the keep rate with its 95% interval (Clopper-Pearson), the
seeds raced and the seconds per decision, with the load average around the trials (docs/judge.md#measured).

    python bench/judge.py --preset tiny noop=tests/judge/planted/noop.py:40 lr3=tests/judge/planted/lr3.py:20

Every judgement's object is kept, one per line, in --log (default judge-bench.jsonl).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

SEED_STRIDE = 100  # trial i races seeds 100 i, 100 i + 1, ...: no two trials share a seed


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    from scipy.stats import beta

    a = (1 - level) / 2
    low = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return low, high


def trial(path: str, seed: int, flags: list[str]) -> dict:
    command = [sys.executable, "-m", "speedladder", "judge", path, "--quiet", "--seed", str(seed), *flags]
    before = os.getloadavg()[0]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode == 2:
        raise SystemExit(f"{path}: {done.stderr.strip()}")
    out = json.loads(done.stdout)
    out["bench"] = {"rc": done.returncode, "wall_s": time.perf_counter() - started, "loadavg_before": before,
                    "loadavg_after": os.getloadavg()[0], "seed": seed}
    return out


def table(rows: dict[str, list[dict]]) -> str:
    head = ("| candidate | trials | keep | revert | undecided | keep rate (95% interval) | whys | seeds (mean) | "
            "s per decision (median, range) |")
    lines = [head, "| --- | ---: | ---: | ---: | ---: | --- | --- | ---: | --- |"]
    for name, got in rows.items():
        n = len(got)
        count = collections.Counter(g["decision"] for g in got)
        low, high = clopper_pearson(count["keep"], n)
        whys = collections.Counter(g["why"].split(":")[0] for g in got)
        seconds = [g["bench"]["wall_s"] for g in got]
        seeds = statistics.fmean(g["seeds"]["used"] if g["seeds"] else 0 for g in got)
        lines.append(f"| {name} | {n} | {count['keep']} | {count['revert']} | {count['undecided']} | "
                     f"{count['keep'] / n:.1%} ({low:.1%}-{high:.1%}) | "
                     f"{', '.join(f'{w} {c}' for w, c in whys.most_common())} | {seeds:.1f} | "
                     f"{statistics.median(seconds):.1f} ({min(seconds):.1f}-{max(seconds):.1f}) |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("candidates", nargs="+", metavar="NAME=FILE.py:TRIALS")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--log", default="judge-bench.jsonl")
    p.add_argument("--out", default="runs/judge-bench", help="the judges' run folders")
    args, flags = p.parse_known_args(argv)
    flags = ["--preset", args.preset, "--device", "cpu", "--out", args.out, *flags]
    rows: dict[str, list[dict]] = {}
    loads = [os.getloadavg()[0]]
    with Path(args.log).open("a") as log:
        for spec in args.candidates:
            name, _, rest = spec.partition("=")
            path, _, count = rest.rpartition(":")
            for i in range(int(count)):
                got = trial(path, SEED_STRIDE * i, flags)
                got["bench"]["candidate"] = name
                log.write(json.dumps(got) + "\n")
                log.flush()
                rows.setdefault(name, []).append(got)
                loads.append(got["bench"]["loadavg_after"])
                print(f"{name} {i + 1}/{count}: {got['decision']} ({got['why']}), {got['bench']['wall_s']:.1f} s",
                      file=sys.stderr, flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip()
    print(f"{time.strftime('%Y-%m-%d')}, commit {commit}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, preset {args.preset}; load average {min(loads):.2f}-{max(loads):.2f} "
          f"(median {statistics.median(loads):.2f}) over the trials\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
