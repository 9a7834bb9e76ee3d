"""bench/: the GPU plan fits one call and reaches every rung, its estimates stand beside their reasoning, its smoke
mode packs what the device returns within the device's limits after every step (so that a call killed mid-step
still returns the steps it finished), a slow preflight does not stop it and a failing one does, and the wheels it
carries are the ones the device lacks."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from speedladder.config.ladders import FULL_LADDER, SOURCE_LADDER
from speedladder.rungs import RUNGS

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
# One call of the GPU plan: about 8 minutes of caps, 480 s at most, inside the device's 10-minute command limit with
# the call's 60 s of margin (timeout_s = caps + 60 at least), and its 15 minutes of device time with 3-4 minutes of
# start.
CAPS_S = (400, 480)
# The H200's preflight on 2026-12-04: import, CUDA context, an eager step and fp8's check 13 s of its 31 s, the
# first compile 15 s of the rest: the plan's preflight compiles nothing now, and must not be cut.
PREFLIGHT_CAP_S = 20
# A refresh of the packed files after a step, which the next step's time pays for: 28 s over the 5 refreshes of
# that call, ~5.5 s each.
REFRESH_S = 5.5
# Rungs of the ladders that only the time left reaches: max-autotune's first step autotunes ~21 GEMMs at ~10 s each
# (7 in 85 s on the H200 before its cap), more than one call holds beside the rest; fp8's tensorwise recipe, a speed
# figure the causality probe fails. Every other rung of both ladders runs in a capped step.
ON_TIME_LEFT = {"max-autotune", "fp8-tensorwise"}
# What the device returns from $OUT (its README's limits): at most 8 files of 16 MiB, no more than 2 folders down,
# names of letters, digits, '.', '_' and '-'. The plan packs into 3 files at the top.
PACKED = {"runs.tgz", "summary.txt", "environment.txt"}
NAME = re.compile(r"[A-Za-z0-9._-]+")
MAX_FILE = 16 * 2**20
needs_tools = pytest.mark.skipif(any(shutil.which(t) is None for t in ("bash", "timeout", "tar")),
                                 reason="needs bash, timeout and tar")


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
    flag = next((f for f in ("--rungs", "--sweep-rungs") if f in args), None)  # a ladder, or a sweep's rungs
    return args[args.index(flag) + 1].split(",") if flag else []


def bench_module(name: str):
    """A script of bench/ as a module (its imports of torch are inside its functions)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def option(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_the_gpu_plan_fits_one_call_and_runs_every_rung():
    gpu = plan("gpu")
    assert [r["cmd"] for r in gpu[:2]] == ["wheels", "preflight"] and gpu[-1]["cmd"] == "pack"
    caps = sum(r["cap"] for r in gpu)
    assert CAPS_S[0] <= caps <= CAPS_S[1], [(r["step"], r["cap"]) for r in gpu]
    assert gpu[1]["cap"] >= PREFLIGHT_CAP_S  # a cold machine's preflight must not be cut
    for r in gpu:  # every cap beside its estimate, and no step planned to overrun it (cap 0: time left only)
        assert r["cap"] == 0 or r["est"] <= r["cap"], r
    for r in gpu[2:-1]:  # each capped step after the preflight also pays for the refresh before it
        assert r["cap"] == 0 or r["est"] + REFRESH_S <= r["cap"], r
    # Only the last steps wait for time left: the sweep, fp8's tensorwise recipe, then max-autotune.
    left = [r["step"] for r in gpu if r["cap"] == 0]
    assert left == ["sweep", "fp8", "autotune"] == [r["step"] for r in gpu[-4:-1]]
    capped = [r for r in gpu if r["cap"]]
    assert sum(r["est"] for r in capped) + REFRESH_S * (len(capped) - 1) <= caps  # the steps and their refreshes
    runs = [r for r in gpu if r["cmd"] in ("run", "sweep", "race")]
    reached = {name for r in runs for name in rungs_of(r["args"])}
    both = set(SOURCE_LADDER) | set(FULL_LADDER) | {"ckpt", "cudagraphs", "muon"}
    assert both <= reached <= set(RUNGS), sorted(reached)
    in_capped = {name for r in runs if r["cap"] for name in rungs_of(r["args"])}
    assert both - ON_TIME_LEFT <= in_capped and not (ON_TIME_LEFT & in_capped), sorted(in_capped)
    # In the order of the value of their figures: d2l-512's R0-R4 with the profile first, then GPT-2 124M compiled,
    # then the CUDA-only rungs, then the race, with a cap of its own.
    assert option(runs[0]["args"], "--preset") == "d2l-512" and "--no-profile" not in runs[0]["args"]
    assert rungs_of(runs[0]["args"]) == list(SOURCE_LADDER)
    gpt2 = rungs_of(runs[1]["args"])
    assert option(runs[1]["args"], "--preset") == "gpt2-124m"
    assert gpt2.index("compile") < gpt2.index("fused-adamw") < gpt2.index("pad-vocab")  # both on compile
    cuda_only = {"max-autotune", "cudagraphs", "fp8", "fp8-tensorwise"}
    first_cuda = next(i for i, r in enumerate(runs) if cuda_only & set(rungs_of(r["args"])))
    assert first_cuda == 2 and runs[3]["cmd"] == "race" and runs[3]["cap"] > 0
    for r in gpu:  # the CUDA-only rungs each in a run on a CUDA preset
        if cuda_only & set(rungs_of(r["args"])):
            assert option(r["args"], "--preset") in ("d2l-512", "gpt2-124m")


def test_every_gpu_estimate_stands_beside_its_reasoning():
    """Each gpu step's comment derives its estimate: it ends on "~EST" (the sum of the parts it names), and the
    measured figures and the leads the parts come from are stated above them."""
    text = (BENCH / "plan.txt").read_text()
    # Which figures were measured on the H200 and which are leads, the gates' targets among them.
    for name in ("Measured on the H200 on 2026-12-04", "wheels 1 s, preflight 31 s, small capped at 171 s",
                 "Leads:", "3 s at d2l-512 B=64 and 8 s at", "a = 5.3 s", "b = 2.8 s a block"):
        assert name in text, name
    comment: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            comment.append(line)
            continue
        words = line.split()
        if words and words[0] == "gpu":
            est = words[2]
            reasoning = " ".join(comment)
            assert re.search(rf"~{est}\b", reasoning), f"{words[1]}: its comment does not derive ~{est}"
        comment = []


@pytest.mark.parametrize("mode", ["gpu", "smoke"])
def test_every_planned_command_line_parses(mode, tmp_path):
    """The plan's flags are the command line's: a flag renamed there breaks this test, not a GPU run."""
    from speedladder.cli import build_parser
    from speedladder.cli.gen import to_settings

    for r in plan(mode):
        if r["cmd"] in ("run", "sweep", "race"):
            to_settings(build_parser().parse_args([r["cmd"], *r["args"], "--out", str(tmp_path)]))
        if r["cmd"] == "preflight":  # its own flags, and the one gpu.sh adds
            bench_module("preflight").parser().parse_args([*r["args"], "--estimate", str(r["est"])])
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


def gpu_env(tmp_path: Path, **more: str) -> dict[str, str]:
    """bench/gpu.sh's environment for a test: its folders under tmp_path (its temporary ones too: a killed plan
    leaves them), no wheels, this Python."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "TMPDIR": str(tmp_path / "tmp"),
            "WHEELS": str(tmp_path / "no-wheels"), "PYTHON": sys.executable,
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), **more}


def unpack(tgz_path: Path, dest: Path) -> list[str]:
    with tarfile.open(tgz_path) as tgz:
        names = tgz.getnames()
        tgz.extractall(dest, filter="data") if sys.version_info >= (3, 12) else tgz.extractall(dest)
    return names


@pytest.mark.slow
@needs_tools
def test_gpu_script_smoke_mode_packs_within_the_devices_limits(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.run(["bash", str(BENCH / "gpu.sh"), "--smoke"], cwd=ROOT, env=gpu_env(tmp_path),
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    files = sorted(out.iterdir())
    assert {f.name for f in files} == PACKED  # 3 of the 8 files the device returns, nothing deeper
    for f in files:
        assert f.is_file() and NAME.fullmatch(f.name) and 0 < f.stat().st_size <= MAX_FILE, f
    unpacked = tmp_path / "unpacked"
    names = unpack(out / "runs.tgz", unpacked)
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
    assert "preflight passed" in environment and "phase import:" in environment  # each phase timed
    assert "pending" not in environment and "-- steps final" in environment
    for r in plan("smoke"):
        assert re.search(rf"^{r['step']}\s+{r['est']}\s+{r['cap']}\s", environment, flags=re.MULTILINE), r["step"]
    summary = (out / "summary.txt").read_text()
    assert "fastest rung that passed every gate" in summary and "cudagraphs: skipped — needs cuda" in summary
    # The short tables come last, in the plan's order: the end of the output is what the device returns.
    tail = proc.stdout.strip().splitlines()
    assert tail[-3].startswith("rung") and tail[-2].startswith("eager") and tail[-1].startswith("bf16")
    assert tail.index(next(line for line in tail if "small/" in line)) < tail.index(
        next(line for line in tail if "gpt2/" in line))


def test_the_plan_in_the_harness_page_is_the_plan_file():
    """docs/gpu-bench.md shows the GPU plan's estimates and caps: they are bench/plan.txt's, step for step."""
    text = (ROOT / "docs" / "gpu-bench.md").read_text()
    section = text[text.index("## The plan"):]
    shown = {m[0]: (int(m[1]), int(m[2])) for m in re.findall(r"^\| (\w+) \| .* \| (\d+) \| (\d+) \|$", section,
                                                               flags=re.MULTILINE)}
    assert shown == {r["step"]: (r["est"], r["cap"]) for r in plan("gpu")}
    # The call it gives: the caps' sum as the plan has it, and a timeout at least 60 s over it, within the
    # device's 10 minutes a command.
    caps = sum(r["cap"] for r in plan("gpu"))
    assert f"caps add up to {caps} s" in section and f"the caps ({caps} s)" in section
    (timeout,) = map(int, re.findall(r"^timeout_s: +(\d+)$", section, flags=re.MULTILINE))
    assert caps + 60 <= timeout <= 600
    assert 'carry:     [".whl"]' in section and "command:   bash bench/gpu.sh" in section


# -- a call cut short: a slow preflight, then a kill ----------------------------------------------------------

def session_pids(sid: int) -> list[int]:
    """The processes of a session (from /proc): gpu.sh's own group and each `timeout`'s group under it."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[3]) == sid:
            pids.append(int(stat.parent.name))
    return pids


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL to gpu.sh's whole process group, as a device limit would, then to what `timeout` had put in groups
    of their own under it, until the session is empty."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    for _ in range(50):
        left = session_pids(proc.pid)
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    raise AssertionError(f"processes of the killed plan still running: {session_pids(proc.pid)}")


@pytest.fixture(scope="module")
def cut_short(tmp_path_factory):
    """The smoke plan with a preflight planted to sleep past its cap, killed (SIGKILL, the whole process group)
    halfway through its second run step (gpt2: its results.json begun, no rung finished)."""
    if any(shutil.which(t) is None for t in ("bash", "timeout", "tar")) or not Path("/proc/self/stat").exists():
        pytest.skip("needs bash, timeout, tar and /proc")
    tmp = tmp_path_factory.mktemp("cut-short")
    lines = []
    for line in (BENCH / "plan.txt").read_text().splitlines():
        words = line.split()
        if words[:2] == ["smoke", "preflight"]:  # capped at 12 s, 60 s of planted sleep after its phases
            line = "smoke preflight 5 12 preflight --device cpu --no-compile --sleep 60"
        lines.append(line)
    (tmp / "plan.txt").write_text("\n".join(lines) + "\n")
    work, log = tmp / "work", tmp / "log.txt"
    with log.open("w") as f:  # a file, not a pipe: a full pipe would stall the plan
        proc = subprocess.Popen(["bash", str(BENCH / "gpu.sh"), "--smoke"], cwd=ROOT, stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env=gpu_env(tmp, PLAN=str(tmp / "plan.txt"), GRACE="3"))
    try:
        deadline = time.monotonic() + 480
        while not list((work / "gpt2").glob("*/results.json")):
            assert proc.poll() is None, f"the plan ended before its second run step: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "the second run step never started"
            time.sleep(0.2)
    finally:
        kill_session(proc)
    return tmp, log.read_text()


@pytest.mark.slow
def test_a_slow_preflight_does_not_stop_the_plan(cut_short):
    tmp, log = cut_short
    preflight = (tmp / "work" / "preflight" / "log.txt").read_text()
    assert "preflight capped during" in preflight, preflight  # stopped by its cap, and said so
    environment = (tmp / "out" / "environment.txt").read_text()
    assert re.search(r"^preflight\s+5\s+12\s+\d+\s+\d+\s+capped \(slow, not failed", environment, re.MULTILINE)
    assert re.search(r"^small\s+\d+\s+\d+\s+\d+\s+\d+\s+ok$", environment, re.MULTILINE), environment
    assert "skipped: the preflight failed" not in log


@pytest.mark.slow
def test_a_plan_killed_mid_step_leaves_valid_files_for_the_steps_it_finished(cut_short):
    tmp, _ = cut_short
    out = tmp / "out"
    files = sorted(out.iterdir())
    assert {f.name for f in files} == PACKED, files  # complete files only: each was renamed into place
    for f in files:
        assert f.is_file() and NAME.fullmatch(f.name) and 0 < f.stat().st_size <= MAX_FILE, f
    unpacked = tmp / "unpacked"
    names = unpack(out / "runs.tgz", unpacked)  # a whole archive, not a truncated one
    (small,) = (unpacked / "small").glob("*/results.json")
    assert json.loads(small.read_text())["status"] == "complete"
    assert not any(n.startswith("./gpt2") for n in names)  # packed before the killed step began
    summary = (out / "summary.txt").read_text()
    assert "tiny B=4 T=32" in summary and "fastest rung that passed every gate" in summary
    environment = (out / "environment.txt").read_text()
    assert re.search(r"^small\s.*\sok$", environment, re.MULTILINE)
    assert re.search(r"^gpt2\s+\d+\s+\d+\s+-\s+-\s+pending$", environment, re.MULTILINE), environment


@pytest.mark.slow
@needs_tools
def test_a_failing_preflight_stops_the_plan(tmp_path):
    """A preflight that finds no CUDA device (here, where there is none) is a real failure: the steps after it
    are skipped with the reason, and the files still come back."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the preflight would pass")
    (tmp_path / "plan.txt").write_text("smoke preflight 3 60 preflight\n"
                                       "smoke small 5 60 run --preset tiny --rungs eager\n"
                                       "smoke pack 1 10 pack\n")
    proc = subprocess.run(["bash", str(BENCH / "gpu.sh"), "--smoke"], cwd=ROOT,
                          env=gpu_env(tmp_path, PLAN=str(tmp_path / "plan.txt")), capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "preflight FAILED: no CUDA device" in proc.stdout
    assert "== small: skipped: the preflight failed" in proc.stdout
    assert {f.name for f in (tmp_path / "out").iterdir()} == PACKED
    assert not (tmp_path / "work" / "small").exists()


@needs_tools
@pytest.mark.parametrize("line, says", [
    ("smoke small five 60 run --preset tiny", "line 1: want MODE STEP EST CAP COMMAND"),
    ("smoke small 5 60 train --preset tiny", "line 1: want MODE STEP EST CAP COMMAND"),
])
def test_a_bad_plan_line_is_one_line_and_exit_2(tmp_path, line, says):
    (tmp_path / "plan.txt").write_text(line + "\n")
    proc = subprocess.run(["bash", str(BENCH / "gpu.sh"), "--smoke"], cwd=ROOT, capture_output=True, text=True,
                          env=gpu_env(tmp_path, PLAN=str(tmp_path / "plan.txt")), timeout=60, check=False)
    assert proc.returncode == 2 and says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # nothing started


@pytest.mark.slow
def test_the_summary_reads_a_race(tmp_path):
    """The plan's last step is a race: its table and notes are the race's, not a ladder's."""
    proc = subprocess.run([sys.executable, str(BENCH / "summary.py"), "--full", str(tmp_path / "full.txt"),
                           str(ROOT / "docs" / "example-race-results.json")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=120, check=True)
    tail = proc.stdout.strip().splitlines()
    assert tail[-6].startswith("config") and "s to target" in tail[-6] and tail[-5].startswith("eager")
    assert "target: val loss" in (tmp_path / "full.txt").read_text()
