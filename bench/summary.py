"""The notes, then a short table, of one or more saved runs: printed last by bench/gpu.sh."""

from __future__ import annotations

import sys

from speedladder import report, results


def main(paths: list[str]) -> int:
    for path in paths:
        saved = results.load(path)
        c, e = saved.config, saved.environment
        print(f"\n{c['preset']} B={c['batch_size']} T={c['seq_len']} on {e['device_name']}, torch {e['torch']} "
              f"({saved.status}): {path}")
        for line in report.notes(saved):
            print("  " + line)
        # The table last: it is what a reader of the tail of a log needs.
        cols = ("rung", "tokens/s", "min–max", "× prev", "pred ×", "err", "× cum", "MFU", "peak mem", "compile s",
                "gate", "verdict")
        rows = report.rows(saved)
        widths = [max(len(col), *(len(r[col]) for r in rows)) for col in cols]
        print("  ".join(col.ljust(w) for col, w in zip(cols, widths)))
        for r in rows:
            print("  ".join(r[col].ljust(w) for col, w in zip(cols, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
