"""A research loop that keeps or reverts each change on `speedladder judge`'s word, never on one run's loss.

Each candidate is one rung on top of what was kept so far; the judge gates it, races it against the kept
configuration over seeds, and answers keep (exit 0), revert (1) or undecided (3) with one JSON object. On the tiny
preset a 3x learning rate is the real win (docs/judge.md says why Muon is not, there).

    python examples/research_loop.py --preset tiny --device cpu
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

CANDIDATES = {  # name: the rung it adds, in speedladder's rung API (docs/rungs.md)
    "lr-half": 'rung.define("lr-half", "half the learning rate", "optimizer", spec={"lr_scale": 0.5})',
    "muon": 'rung.define("try-muon", "Muon for the hidden matrices", "optimizer", spec={"optimizer": "muon"})',
    "lr-3x": 'rung.define("lr-3x", "three times the learning rate", "optimizer", spec={"lr_scale": 3.0})',
    "no-mask": ('rung.define("no-mask", "attention without its mask: a bug", "speed", model=lambda m: '
                '[b.attn.causal_mask.fill_(True) for b in m.blocks] and m)'),
    "no-op": 'rung.define("no-op", "changes nothing", "speed", spec={})',
}


def judge(candidate: Path, base: Path | None, flags: list[str]) -> dict:
    command = [sys.executable, "-m", "speedladder", "judge", str(candidate), "--quiet", *flags]
    command += ["--base", str(base)] if base else []
    done = subprocess.run(command, capture_output=True, text=True, check=False)  # exit 0 keep, 1 revert, 3 undecided
    if done.returncode == 2:  # bad input: one line on stderr, nothing judged
        raise SystemExit(done.stderr.strip())
    return json.loads(done.stdout)


def main(flags: list[str]) -> list[tuple[str, str]]:
    folder = Path(tempfile.mkdtemp(prefix="research-loop-"))
    kept: list[str] = []  # the rungs kept so far, as lines of one rung file: the base of the next candidate
    log = []
    for name, line in CANDIDATES.items():
        base = folder / f"base-{len(kept)}.py" if kept else None
        if base:
            base.write_text("from speedladder import rung\n" + "\n".join(kept) + "\n")
        candidate = folder / f"{name}.py"
        candidate.write_text(f"from speedladder import rung\n{line}\n")
        verdict = judge(candidate, base, flags)
        if verdict["decision"] == "keep":
            kept.append(line)
        speedup = (verdict["effect"] or {}).get("speedup")
        print(f"{name:8} {verdict['decision']:9} {verdict['why'][:60]:60} "
              f"{f'{speedup:.2f}x' if speedup else '-':>6} {verdict['seeds']['used'] if verdict['seeds'] else 0} seeds"
              f" {verdict['cost']['seconds']:5.1f} s", flush=True)
        log.append((name, verdict["decision"]))
    return log


if __name__ == "__main__":
    main(sys.argv[1:])
