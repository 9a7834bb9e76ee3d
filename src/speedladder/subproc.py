"""Fresh Python processes that import this same speedladder: the profiler's, the memory probe's, torchrun's ranks,
`check`'s re-run and a judge's workers.

Each gets this package's source folder first on PYTHONPATH (an editable install, a source tree or a wheel:
the child runs the code the parent runs), and PYTHONSAFEPATH=1 (Python 3.11+), which keeps the working
directory off the child's sys.path: `python -m` would otherwise put it first, and a user's `speedladder.py`,
`torch.py` or a stray folder named like a module (`z3/`) beside their data would shadow the real one. On
Python 3.10 the variable is ignored and the working directory stays on the path.

`run_module` is the one way a parent asks a child for one answer: a pickled request in, a JSON answer out,
and the child's last line of stderr as the error when it fails. `serve` is the child's side. `start` starts one
that stays, for many requests (judge/remote.py holds the conversation).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1])  # the folder that holds this package


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment, with this speedladder first on the path and the working directory off it."""
    path = os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "PYTHONSAFEPATH": "1", **extra}


def run_module(module: str, request: object, what: str, timeout_s: float, **env: str) -> object:
    """`python -m module REQUEST ANSWER` in a fresh process; the JSON it wrote to ANSWER.

    A plain subprocess, not multiprocessing: it works whatever the parent's __main__ is (a script, a notebook,
    pytest). The child's stderr (a profiler's or a compiler's chatter) is kept, and its last line is the
    RuntimeError raised when the child fails. what: the process in words, for the errors ("the profiling
    process").
    """
    with tempfile.TemporaryDirectory(prefix="speedladder-child-") as tmp:
        req, answer = Path(tmp) / "request.pkl", Path(tmp) / "answer.json"
        req.write_bytes(pickle.dumps(request))
        try:
            proc = subprocess.run([sys.executable, "-m", module, str(req), str(answer)], check=False,
                                  capture_output=True, text=True, timeout=timeout_s, env=child_env(**env))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{what} took longer than {timeout_s:.0f} s") from None
        if proc.returncode != 0 or not answer.exists():
            # USDT lines are a tracing probe's notices some builds print, never the error.
            lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip() and not ln.startswith("USDT")]
            raise RuntimeError(lines[-1] if lines else f"{what} exited with {proc.returncode}")
        return json.loads(answer.read_text())


def serve(argv: list[str], answer_of: Callable[..., object]) -> int:
    """The child's side of run_module: unpickle the request, call answer_of(*request), write its JSON."""
    req, answer = argv
    Path(answer).write_text(json.dumps(answer_of(*pickle.loads(Path(req).read_bytes()))))
    return 0


def start(module: str, **env: str) -> subprocess.Popen[bytes]:
    """`python -m module` in a fresh process that stays to answer requests (a judge's worker): its stdin, stdout and
    stderr pipes of ours, in a session of its own, so that it and anything it starts are stopped, resumed and ended
    together (os.killpg)."""
    return subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=child_env(**env), start_new_session=True)
