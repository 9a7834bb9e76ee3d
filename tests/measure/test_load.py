"""A machine that is not alone is named (measure/machine_load.py): other processes' CPU time read from /proc around each
timed window, never inside one; the windows they shared marked in results.json, and the header says so."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cli, only_folder, resolved

from speedladder.measure import machine_load, timer
from speedladder.records import Environment, MachineLoad, RaceEntry, RaceRun, RaceSection, Results, storage
from speedladder.report import machine_notes

RUN = ["run", "--preset", "tiny", "--device", "cpu", "--rungs", "eager,sdpa", "--window-steps", "40", "--windows", "3",
       "--loss-steps", "2", "--learns-steps", "0", "--no-profile", "--no-process-peak", "--quiet"]


def fake_proc(root: Path, cpus: dict[int, list[int]], processes: dict[int, tuple[str, int, int]]) -> Path:
    """A /proc of our own: per-CPU counters (ticks) and processes (pid: name, parent, CPU ticks)."""
    root.mkdir(parents=True, exist_ok=True)
    lines = ["cpu  " + " ".join(str(sum(v[i] for v in cpus.values())) for i in range(8))]
    lines += [f"cpu{n} " + " ".join(map(str, v)) for n, v in cpus.items()]
    (root / "stat").write_text("\n".join(lines + ["intr 0", "ctxt 0"]) + "\n")
    (root / "loadavg").write_text("0.50 0.40 0.30 1/90 123\n")
    for pid, (name, parent, ticks) in processes.items():
        (root / str(pid)).mkdir(exist_ok=True)
        fields = ["S", str(parent)] + ["0"] * 9 + [str(ticks), "0"] + ["0"] * 30
        (root / str(pid) / "stat").write_text(f"{pid} ({name}) " + " ".join(fields) + "\n")
    return root


def test_others_are_the_cores_busy_time_less_our_own():
    meter = machine_load.Meter(Path("/nonexistent"), (0, 1), 0.01)
    a = machine_load.Reading(wall=10.0, busy_s=100.0, steal_s=1.0, own_s=50.0)
    # Over 0.5 s the two cores were busy 1.4 s, of which we used 0.9 s: the others 0.5 s, one core's worth.
    other = meter.between(a, machine_load.Reading(10.5, 101.4, 1.0, 50.9))
    assert (other.seconds, other.wall, other.cores, other.shared) == pytest.approx((0.5, 0.5, 1.0, True))
    # A tenth of a core over a window is the machine's own chatter, not a neighbour; nor is one tick in a short one.
    assert not meter.between(a, machine_load.Reading(11.0, 101.0, 1.0, 50.9)).shared
    assert not meter.between(a, machine_load.Reading(10.02, 100.03, 1.0, 50.0)).shared  # 30 ms: under MIN_OTHER_S
    assert meter.between(a, machine_load.Reading(10.5, 100.2, 1.0, 50.9)).seconds == 0.0  # rounding apart: never below 0
    assert meter.between(a, machine_load.Reading(10.1, 101.0, 1.0, 50.0)).cores == 2.0  # never more than our cores
    # Steal is read apart: a hypervisor that took half a core is no other process, and does not share the window.
    stolen = meter.between(a, machine_load.Reading(10.5, 100.9, 1.25, 50.9))
    assert stolen.steal_cores == pytest.approx(0.5) and stolen.seconds == pytest.approx(0.0) and not stolen.shared


def test_the_threshold_is_relative_to_the_cores():
    """A sixteenth of the cores, at least a quarter of one: on the 2 cores it was set on, as before; on the H200
    machine's 16 (the run of 2026-12-04 at 837fae3, whose windows saw up to 0.68 cores of others), one core."""
    assert [machine_load.shared_cores(n) for n in (1, 2, 4, 16, 128)] == [0.25, 0.25, 0.25, 1.0, 8.0]
    assert machine_load.shared(0.34, 0.5, 16) is False  # 0.68 cores of 16
    assert machine_load.shared(0.34, 0.5, 2) is True  # the same on 2 cores
    assert machine_load.shared(0.75, 0.5, 16) is True  # 1.5 cores of 16
    assert machine_load.Meter(Path("/nonexistent"), tuple(range(16)), 0.01).shared_cores == 1.0


def test_the_meter_reads_our_cores_and_names_the_other_processes(tmp_path):
    me = os.getpid()
    # user nice system idle iowait irq softirq steal, in ticks; cpu7 is not one this process may run on.
    cpus = {0: [100, 0, 50, 1000, 70, 3, 2, 5], 1: [100, 0, 50, 1000, 70, 0, 0, 0], 7: [999, 0, 0, 0, 0, 0, 0, 0]}
    root = fake_proc(tmp_path / "a", cpus, {1: ("init", 0, 10), me: ("pytest", 1, 500), 4242: ("spin", 1, 100),
                                            4243: ("child", me, 300), 4244: ("grandchild", 4243, 300)})
    meter = machine_load.Meter(root, (0, 1), 0.01)
    reading = meter.read()
    # Busy: user, nice, system, irq and softirq; idle and iowait are not (a core waiting on a disk is idle), and
    # steal is read apart.
    assert reading.busy_s == pytest.approx((100 + 50 + 3 + 2 + 100 + 50) * 0.01) and reading.steal_s == 0.05
    first = meter.snapshot()
    assert set(first[1]) == {1, 4242}  # neither this process nor its descendants: a compile worker is ours
    fake_proc(tmp_path / "a", cpus, {1: ("init", 0, 11), me: ("pytest", 1, 900), 4242: ("spin", 1, 200),
                                     4243: ("child", me, 350), 4244: ("grandchild", 4243, 300),
                                     5000: ("late", 1, 20)})
    later = (machine_load.Reading(first[0].wall + 1.0, first[0].busy_s, first[0].steal_s, first[0].own_s), meter.snapshot()[1])
    busy = meter.busiest(first, later)
    # spin used 1.0 s of CPU over 1 s; late began meanwhile (all its 0.2 s inside the span); init's 10 ms is not
    # named; this process's own 4 s and its child's 0.5 s never are.
    assert [(b.name, b.pid) for b in busy] == [("spin", 4242), ("late", 5000)]
    assert [b.cores for b in busy] == pytest.approx([1.0, 0.2])
    assert meter.loadavg() == 0.5


def test_our_own_compile_workers_are_not_neighbours_and_steal_is_apart(tmp_path):
    """16 cores, as on the H200 of 2026-12-04 at 837fae3: inductor's compile workers (a child of ours and its
    pool's workers, reaped or not) busy while a window ran, and the hypervisor's steal, are neither others nor a
    shared window; a stranger on 1.5 cores is."""
    me = os.getpid()
    idle = [0] * 8

    def proc(worker_ticks: int, reaped_ticks: int, stranger_ticks: int, busy_ticks: int, steal_ticks: int) -> Path:
        cpus = {n: list(idle) for n in range(16)}
        cpus[0][0], cpus[1][7] = busy_ticks, steal_ticks
        return fake_proc(tmp_path / "proc", cpus, {
            me: ("python", 1, 0), 7000: ("compile_worker", me, reaped_ticks), 7001: ("worker", 7000, worker_ticks),
            9000: ("stranger", 1, stranger_ticks)})

    meter = machine_load.Meter(proc(0, 0, 0, 0, 0), tuple(range(16)), 0.01)
    a = meter.read()
    # Over ~1 s: our pool's worker 40 ticks, one of its workers reaped by the pool with 20 more (in the pool's
    # cutime, which the fake writes as its own), 60 ticks in all on the cores, and 3 of steal.
    proc(40, 20, 0, 60, 3)
    b = dataclasses.replace(meter.read(), wall=a.wall + 1.0)  # this process's own real CPU time meanwhile: ~0
    other = meter.between(a, b)
    assert other.seconds == pytest.approx(0.0, abs=0.05) and not other.shared
    assert other.steal_cores == pytest.approx(0.03)
    # A stranger on 1.5 cores beside the same workers: the others, and the window shared (1 core of 16 makes it so).
    proc(80, 40, 150, 120 + 150, 6)
    c = dataclasses.replace(meter.read(), wall=b.wall + 1.0)
    other = meter.between(b, c)
    assert other.cores == pytest.approx(1.5, abs=0.05) and other.shared


def test_a_stat_line_and_the_tree_of_descendants():
    # utime 7, stime 3, cutime 20 (a reaped child's), cstime 0 ticks; a name with a space and parentheses.
    line = "77 (tmux: (server)) S 1 77 77 0 -1 4194560 0 0 0 0 7 3 20 0 20 0 1 0 100 0 0"
    assert machine_load.parse_stat(line, 0.01) == machine_load.Process("tmux: (server)", 1, pytest.approx(0.3))
    procs = {pid: machine_load.Process(str(pid), parent, 0.0)
             for pid, parent in {1: 0, 10: 1, 11: 10, 12: 11, 13: 10, 20: 1, 21: 20}.items()}
    assert machine_load.descendants(procs, 10) == {11, 12, 13} and machine_load.descendants(procs, 12) == set()


def test_a_window_reads_the_load_only_outside_its_steps(tmp_path):
    meter = machine_load.Meter(fake_proc(tmp_path, {0: [0] * 8}, {}), (0,), 0.01)
    reads: list[str] = []
    real = meter.read
    meter.read = lambda: (reads.append("read"), real())[1]  # type: ignore[method-assign]
    step = lambda: reads.append("step")
    w = timer.time_window(step, torch_cpu(), 4, 3, counter=lambda: 0, edge=lambda: reads.append("edge"), meter=meter)
    assert reads == ["read", "edge", "step", "step", "step", "edge", "read"]
    assert w.other_cores == 0.0 and not w.shared


def torch_cpu():
    import torch

    return torch.device("cpu")


def _machine(**kw) -> Results:
    res = Results(schema=storage.SCHEMA, created="", command=[], config=resolved(), model={"preset": "tiny"},
                  environment=Environment(device_name="cpu", device_type="cpu", device="cpu", torch="2"))
    res.machine = MachineLoad(cores=2, shared_cores=machine_load.shared_cores(2), **kw)
    return res


def test_the_header_line_says_what_shared_the_machine_and_only_then():
    assert machine_notes.header_line(_machine(before=0.05, windows=10)) is None  # alone
    from speedladder.records import BusyProcess

    line = machine_notes.header_line(_machine(before=0.05, windows=10, shared_windows=4, most=0.97,
                                        processes=[BusyProcess("spin", 4242, 0.95)]))
    assert line is not None and line.startswith("machine not alone: other processes used up to 0.97 of 2 cores "
                                                 "during 4 of 10 timed windows; 0.05 before the first")
    assert "spin (pid 4242) 0.95 cores" in line and "marked (shared) in results.json" in line
    race = _machine(runs=8, shared_runs=2, most=1.1)
    race.race = RaceSection(seeds=[0, 1], entries=[RaceEntry("eager", ["eager"], "rung", "", "speed", None, {}, "fp32",
                                                             runs=[RaceRun(0, "reached", shared=True, other_cores=1.1,
                                                                           stage=1)])])
    assert "during 2 of 8 race runs" in (machine_notes.header_line(race) or "")
    assert machine_notes.run_lines(race.race) == ["eager: other processes shared its runs of seed 0 (stage 1, 1.10 cores)."]


@pytest.fixture
def spinner():
    """A process that spins on a core for as long as the test runs: a planted neighbour, and no descendant of ours
    (a child of ours is the run's own work): started by a child that leaves at once, so that init adopts it."""
    spawn = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'while True: pass'], "
             "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, "
             "start_new_session=True); print(p.pid)")
    pid = int(subprocess.run([sys.executable, "-c", spawn], capture_output=True, text=True, check=True).stdout)
    time.sleep(0.3)  # running before the run begins
    yield pid
    os.kill(pid, signal.SIGKILL)


def test_a_planted_busy_process_is_named_in_the_header_and_its_windows_marked(tmp_path, spinner):
    rc, out, _ = cli(*RUN, "--out", str(tmp_path))
    assert rc == 0
    folder = only_folder(tmp_path)
    saved = json.loads((folder / "results.json").read_text())
    m = saved["machine"]
    assert m["cores"] >= 1 and m["windows"] == 3 + 2 * 3 and m["shared_windows"] >= 1 and m["most"] >= 0.25
    assert spinner in [p["pid"] for p in m["processes"]]  # named, among the busiest others
    windows = [w for r in saved["rungs"] for t in (r["timing"], r.get("base_timing") or {}) for w in t.get("windows", [])]
    assert all(w["other_cores"] is not None for w in windows) and any(w["shared"] for w in windows)
    first = out.splitlines()[0]
    assert first.startswith("machine not alone: other processes used up to") and "timed windows" in first
    page = (folder / "report.html").read_text()
    assert 'id="machine-not-alone"' in page and "machine not alone" in page
    assert cli("report", str(folder))[1].splitlines()[0] == first  # from the saved file alone


def test_a_run_on_a_quiet_machine_shows_no_such_line(tmp_path, monkeypatch):
    # A /proc whose counters never move: nothing else runs (this machine is shared with other work, so a real quiet
    # one cannot be had on demand). What the run reads is still read the same way.
    monkeypatch.setattr(machine_load, "PROC", fake_proc(tmp_path / "proc", {n: [0] * 8 for n in range(os.cpu_count() or 1)},
                                                 {}))
    rc, out, _ = cli(*RUN, "--out", str(tmp_path / "runs"))
    assert rc == 0 and "machine not alone" not in out
    folder = only_folder(tmp_path / "runs")
    saved = storage.load(folder)
    assert saved.machine is not None and saved.machine.alone and saved.machine.windows == 9
    assert saved.machine.before == 0.0 and saved.machine.loadavg == 0.5
    page = (folder / "report.html").read_text()
    assert "machine-not-alone" not in page and "alone: no other process used 0.25 of a core over any of 9" in page


def test_a_file_from_before_the_meter_loads_and_says_nothing():
    old = storage.load(Path(__file__).parents[1] / "fixtures" / "results-schema1.json")
    assert old.machine is None and machine_notes.header_line(old) is None and machine_notes.html_value(old) is None
