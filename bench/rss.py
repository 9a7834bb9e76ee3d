"""The main process's peak resident memory on the bundled corpus, a 1M-token and a 1B-token token file.

    python bench/rss.py [--tokens 1000000,1000000000] [--keep DIR]

Each case runs `speedladder run --preset tiny --rungs eager --no-profile --no-process-peak` (the learns-check
included: 300 untimed steps, where the allocator's kept memory used to pile up) in a fresh process, with a
50,304-token vocabulary for the token files (nanoGPT's padded GPT-2 vocabulary, uniform random ids). The peak is
the child's maximum resident set as the kernel counts it (wait4's rusage). The files are written to a temporary folder
(2 GB for 1B tokens) and removed afterwards unless --keep names a folder. Prints one table; docs/benchmarks.md
records its figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

VOCAB = 50304
SRC = str(Path(__file__).resolve().parents[1] / "src")
COMMAND = ["run", "--preset", "tiny", "--device", "cpu", "--rungs", "eager", "--no-profile", "--no-process-peak",
           "--quiet"]


def token_file(path: Path, n: int) -> Path:
    """n uniform random ids below VOCAB, uint16, written 50M at a time (never whole in memory)."""
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        for start in range(0, n, 50_000_000):
            rng.integers(0, VOCAB, min(50_000_000, n - start), dtype=np.uint16).tofile(f)
    return path


def peak_rss(args: list[str], out: Path) -> tuple[float, float, int]:
    """(max resident MiB, wall seconds, exit status) of one `speedladder` command in a fresh process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child runs the command and nothing else, so its rusage is the command's own
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # its table is not this script's output
        os.execve(sys.executable, [sys.executable, "-m", "speedladder", *args, "--out", str(out)], env)
    _, status, usage = os.wait4(pid, 0)
    return usage.ru_maxrss / 1024, time.perf_counter() - t0, os.waitstatus_to_exitcode(status)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", default="1000000,1000000000", help="token-file sizes, comma-separated")
    p.add_argument("--keep", help="write the token files here and keep them")
    a = p.parse_args()
    folder = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="speedladder-rss-"))
    folder.mkdir(parents=True, exist_ok=True)
    cases = [("timemachine (bundled)", [], None)]
    for n in (int(x) for x in a.tokens.split(",")):
        path = folder / f"tokens-{n}.bin"
        if not path.exists():
            token_file(path, n)
        cases.append((f"{n:,} tokens, vocab {VOCAB:,}", ["--data", str(path), "--vocab-size", str(VOCAB)], n))
    rows = []
    for name, extra, _ in cases:
        rss, wall, rc = peak_rss([*COMMAND, *extra], folder / "runs")
        rows.append((name, rss, wall, rc))
        print(f"{name}: max resident {rss:,.0f} MiB, {wall:.0f} s, exit {rc}", file=sys.stderr, flush=True)
    base = rows[0][1]
    print(f"{'corpus':34s} {'max RSS MiB':>12s} {'over bundled':>13s} {'wall s':>7s} {'exit':>5s}")
    for name, rss, wall, rc in rows:
        print(f"{name:34s} {rss:12,.0f} {rss - base:+13,.0f} {wall:7.0f} {rc:5d}")
    if not a.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return 0 if all(r[3] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
