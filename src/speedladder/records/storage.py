"""results.json on disk: the environment a result needs to be trusted, atomic saves, and loading any version.

The file holds the resolved config, the environment (device, versions, git
commit), and for every rung its spec, raw window times, derived figures and
gate verdicts. Reports are drawn from this file alone.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

from speedladder import processor
from speedladder.errors import UsageError
from speedladder.meta import __version__
from speedladder.records import Environment, Results, from_dict, to_dict

# Version 2: typed records (this module) with the same field names as version 1, plus the version itself.
SCHEMA = "speedladder.results/2"
READABLE_SCHEMAS = ("speedladder.results/1", SCHEMA)  # what `load` accepts: every file written so far
FILENAME = "results.json"


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    """One line from a helper command, or None where it is missing or fails (it is optional context)."""
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def git_commit() -> str | None:
    """The commit of the speedladder source tree, with '-dirty' if it has changes; None if not a checkout."""
    src = Path(__file__).resolve().parents[1]  # the package's folder (this module is in its records/)
    top = _run(["git", "rev-parse", "--show-toplevel"], cwd=src)
    # An installed copy inside some other repository (a venv in a project) is not a speedladder checkout.
    if top is None or Path(top).resolve() / "src" / "speedladder" != src:
        return None
    commit = _run(["git", "rev-parse", "HEAD"], cwd=src)
    if commit is None:
        return None
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=src)
    return commit + ("-dirty" if dirty else "")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass  # not Linux: platform.processor() below is the fallback
    return platform.processor() or platform.machine()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return "Apple GPU (MPS)"
    return cpu_name()


def environment(device: torch.device) -> Environment:
    """This machine's device, versions and commit, for a new result."""
    env: dict[str, object] = {
        "device": str(device),
        "device_type": device.type,
        "device_name": device_name(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "driver": None,
        "cuda_capability": None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_threads": torch.get_num_threads(),
        **processor.cpu().to_dict(),  # the vector ISA and whether bf16 is native: what a CPU verdict rests on
        "muon": processor.ns_dtype_for(device)[1],  # how the muon rung iterates here
        "speedladder": __version__,
        "git_commit": git_commit(),
    }
    if device.type == "cuda":
        env["cuda_capability"] = list(torch.cuda.get_device_capability(device))
        env["driver"] = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader",
                              f"--id={device.index or 0}"])
    return from_dict(Environment, env)


def new_run_dir(parent: str) -> Path:
    """runs/<UTC timestamp>/, never reusing a folder."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = Path(parent)
    path = base / stamp
    n = 1
    while path.exists():
        path = base / f"{stamp}-{n}"
        n += 1
    try:
        path.mkdir(parents=True)
    except OSError as e:
        raise UsageError(f"cannot create the run folder {path}: {e.strerror}") from None
    return path


def save(results: Results | dict, run_dir: Path, filename: str = FILENAME) -> Path:
    """Write atomically: an interruption mid-write leaves the previous complete file."""
    if isinstance(results, dict):
        results["updated"] = now()
    else:
        results.updated = now()
    path = run_dir / filename
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(to_dict(results), indent=1, allow_nan=False))
    os.replace(tmp, path)
    return path


def load(run: str | Path) -> Results:
    """A run folder or a results.json path, as typed records; any schema this project has written loads."""
    path = Path(run)
    if path.is_dir():
        path = path / FILENAME
    if not path.is_file():
        raise UsageError(f"no {FILENAME} at {path}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path} is not a valid results file: {e}") from None
    if not isinstance(data, dict) or data.get("schema") not in READABLE_SCHEMAS:
        raise UsageError(f"{path} is not a speedladder results file (schema {SCHEMA})")
    try:
        return from_dict(Results, data)
    except (UsageError, ValueError) as e:  # the codec names the field: a required one missing, or of the wrong kind
        raise UsageError(f"{path} is not a valid results file: {e}") from None


def command_line() -> list[str]:
    return [Path(sys.argv[0]).name, *sys.argv[1:]]
