"""bench/: the GPU plan fits its minutes and reaches every rung, its smoke mode packs what the device returns
within the device's limits, and the wheels it carries are the ones the device lacks."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from speedladder.ladders import FULL_LADDER
from speedladder.rungs import RUNGS

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
CALL_S = 360  # one call of the GPU plan: 6 of the device's 15 minutes, machine start aside, leaving a rerun
# What the device returns from $OUT (its README's limits): at most 8 files of 16 MiB, no more than 2 folders down,
# names of letters, digits, '.', '_' and '-'. The plan packs into 3 files at the top.
PACKED = {"runs.tgz", "summary.txt", "environment.txt"}
NAME = re.compile(r"[A-Za-z0-9._-]+")
MAX_FILE = 16 * 2**20


def plan(mode: str) -> list[dict]:
    """bench/plan.txt's lines of one mode: step, est, cap, command, the command's arguments."""
    rows = []
    for line in (BENCH / "plan.txt").read_text().splitlines():
        words = line.split()
        if words and not words[0].startswith("#") and words[0] == mode:
            _, step, est, cap, cmd, *args = words
            rows.append({"step": step, "est": int(est), "cap": int(cap), "cmd": cmd, "args": args})
    return rows


def rungs_of(args: list[str]) -> list[str]:
    return args[args.index("--rungs") + 1].split(",") if "--rungs" in args else []


def test_the_gpu_plan_fits_one_call_and_runs_every_rung():
    gpu = plan("gpu")
    assert [r["cmd"] for r in gpu[:2]] == ["wheels", "preflight"] and gpu[-1]["cmd"] == "pack"
    assert sum(r["cap"] for r in gpu) <= CALL_S, [(r["step"], r["cap"]) for r in gpu]
    for r in gpu:  # every cap beside its estimate, and no step planned to overrun it (cap 0: time left only)
        assert r["cap"] == 0 or r["est"] <= r["cap"], r
    assert [r["step"] for r in gpu if r["cap"] == 0] == ["sweep"]  # only the sweep waits for time left
    reached = {name for r in gpu if r["cmd"] in ("run", "sweep") for name in rungs_of(r["args"])}
    assert set(FULL_LADDER) | {"ckpt", "cudagraphs", "muon"} <= reached, sorted(reached)
    assert reached <= set(RUNGS)
    for r in gpu:  # the CUDA-only rungs each in a run on a CUDA preset
        if {"max-autotune", "cudagraphs", "fp8"} & set(rungs_of(r["args"])):
            assert r["args"][r["args"].index("--preset") + 1] in ("d2l-512", "gpt2-124m")


@pytest.mark.parametrize("mode", ["gpu", "smoke"])
def test_every_planned_command_line_parses(mode, tmp_path):
    """The plan's flags are the command line's: a flag renamed there breaks this test, not a GPU run."""
    from speedladder.cli import build_parser
    from speedladder.cli.gen import to_settings

    for r in plan(mode):
        if r["cmd"] in ("run", "sweep"):
            to_settings(build_parser().parse_args([r["cmd"], *r["args"], "--out", str(tmp_path)]))
    assert {r["cmd"] for r in plan("smoke")} == {"wheels", "preflight", "run", "pack"}


def device_env() -> dict[str, str]:
    """The device's environment markers: CPython 3.12 on x86-64 Linux."""
    return {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def test_the_carried_wheels_are_the_dependencies_the_device_image_lacks():
    """pyproject's dependencies and the fp8 extra, as the device's Python 3.12 reads their markers, less the
    image's packages: exactly bench/wheels.txt, each pinned to a version the project accepts."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from speedladder.codec import tomllib  # the standard library's from 3.11, tomli on 3.10

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(d) for d in (*project["dependencies"], *project["optional-dependencies"]["fp8"])]
    wanted = [r for r in wanted if r.marker is None or r.marker.evaluate(device_env())]
    image = {canonicalize_name(line.strip()) for line in (BENCH / "device-packages.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")}
    missing = {canonicalize_name(r.name): r for r in wanted if canonicalize_name(r.name) not in image}
    carried = [Requirement(line.strip()) for line in (BENCH / "wheels.txt").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    assert {canonicalize_name(r.name) for r in carried} == set(missing)
    for r in carried:
        (pin,) = r.specifier  # one exact version: one wheel of each, as pip needs
        assert pin.operator == "==" and missing[canonicalize_name(r.name)].specifier.contains(pin.version), r
    # The folder the wheels land in never travels by accident: git ignores it, the device call carries it.
    assert ".whl/" in (ROOT / ".gitignore").read_text().splitlines()


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None or shutil.which("tar") is None,
                    reason="needs bash, timeout and tar")
def test_gpu_script_smoke_mode_packs_within_the_devices_limits(tmp_path):
    out, work, wheels = tmp_path / "out", tmp_path / "work", tmp_path / "no-wheels"
    env = {**os.environ, "OUT": str(out), "WORK": str(work), "WHEELS": str(wheels), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(BENCH / "gpu.sh"), "--smoke"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    files = sorted(out.iterdir())
    assert {f.name for f in files} == PACKED  # 3 of the 8 files the device returns, nothing deeper
    for f in files:
        assert f.is_file() and NAME.fullmatch(f.name) and 0 < f.stat().st_size <= MAX_FILE, f
    unpacked = tmp_path / "unpacked"
    with tarfile.open(out / "runs.tgz") as tgz:
        names = tgz.getnames()
        tgz.extractall(unpacked, filter="data") if sys.version_info >= (3, 12) else tgz.extractall(unpacked)
    assert not any(n.endswith("trace.json") for n in names)  # the profile's trace stays behind
    for step in ("small", "gpt2"):
        (path,) = (unpacked / step).glob("*/results.json")
        assert json.loads(path.read_text())["status"] == "complete"
        assert (path.parent / "waterfall.png").exists() and (path.parent / "report.html").exists()
        assert (unpacked / step / "log.txt").read_text()
    assert (work / "small").is_dir() and list((work / "small").glob("*/trace.json"))  # kept unpacked, here only
    gpt2 = json.loads(next((unpacked / "gpt2").glob("*/results.json")).read_text())
    assert gpt2["corpus"] == {"source": "tinyshakespeare", "tokenizer": "gpt2", "tokens": 338_025,
                              "vocab_size": 50257, "train_tokens": 304_223, "val_tokens": 33_802,
                              "val_from": "the last 10% of tinyshakespeare"}
    small = json.loads(next((unpacked / "small").glob("*/results.json")).read_text())
    assert {r["name"]: r["status"] for r in small["rungs"]}["cudagraphs"] == "skipped"  # CUDA-only, said why
    environment = (out / "environment.txt").read_text()
    assert "preflight passed" in environment
    for r in plan("smoke"):
        assert re.search(rf"^{r['step']}\s+{r['est']}\s+{r['cap']}\s", environment, flags=re.MULTILINE), r["step"]
    summary = (out / "summary.txt").read_text()
    assert "fastest rung that passed every gate" in summary and "cudagraphs: skipped — needs cuda" in summary
    # The short tables come last, in the plan's order: the end of the output is what the device returns.
    tail = proc.stdout.strip().splitlines()
    assert tail[-3].startswith("rung") and tail[-2].startswith("eager") and tail[-1].startswith("bf16")
    assert tail.index(next(line for line in tail if "small/" in line)) < tail.index(
        next(line for line in tail if "gpt2/" in line))


def test_the_plan_in_the_usage_guide_is_the_plan_file():
    """docs/usage.md shows the GPU plan's estimates and caps: they are bench/plan.txt's, step for step."""
    text = (ROOT / "docs" / "usage.md").read_text()
    section = text[text.index("## On a GPU"):]
    shown = {m[0]: (int(m[1]), int(m[2])) for m in re.findall(r"^\| (\w+) \| .* \| (\d+) \| (\d+) \|$", section,
                                                               flags=re.MULTILINE)}
    assert shown == {r["step"]: (r["est"], r["cap"]) for r in plan("gpu")}
