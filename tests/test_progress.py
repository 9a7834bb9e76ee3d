"""Long work shows progress while it runs (progress.Task): elapsed time and an estimate, a bar on a terminal and
plain lines in a log, a ticker thread that ends with the task and never runs where work is timed."""

from __future__ import annotations

import io
import logging
import sys
import threading
import time
import types
from collections.abc import Callable

import pytest
from rich.console import Console

from speedladder import progress
from speedladder.progress import LOGGER, Progress, Task, clock, task_of


class Lines(logging.Handler):
    """The progress lines as a log would hold them: (phase, message)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((getattr(record, "phase", ""), record.getMessage()))


@pytest.fixture
def log(monkeypatch) -> Lines:
    lines = Lines()
    monkeypatch.setattr(LOGGER, "handlers", [lines])
    monkeypatch.setattr(LOGGER, "level", logging.INFO)
    monkeypatch.setattr(progress, "TICK_S", 0.01)
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.05)
    return lines


def test_clock():
    assert (clock(0), clock(59.6), clock(61), clock(3725)) == ("0:00", "1:00", "1:01", "1:02:05")


def test_a_long_task_in_a_log_says_it_began_ticks_with_its_elapsed_time_and_says_it_ended(log):
    with Progress().scoped("compile").task("the first step", estimate_s=30.0) as task:
        time.sleep(0.3)
        assert task.ticking
    assert not task.ticking and not any(t.name == "speedladder-progress" for t in threading.enumerate())
    phases = {phase for phase, _ in log.lines}
    messages = [m for _, m in log.lines]
    assert phases == {"compile"} and messages[0] == "the first step (about 0:30)"
    ticks = [m for m in messages[1:-1]]
    assert len(ticks) >= 2 and all(m.startswith("the first step: 0:00 elapsed, about 0:") for m in ticks)
    assert messages[-1] == "the first step: done in 0:00"


def test_a_task_with_steps_estimates_from_its_rate_and_one_with_timed_work_has_no_thread(log, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    with Progress().scoped("race stage 1").task("eager, compile, 4 seeds", total=4, tick=False) as task:
        assert not task.ticking  # its runs' stretches are timed: no thread beside them
        now[0] += 10.0
        task.advance(note="seed 0 done")
        assert task.left() == pytest.approx(30.0)
        now[0] += 30.0
        task.advance()
    assert [m for _, m in log.lines] == [
        "eager, compile, 4 seeds", "eager, compile, 4 seeds: 0:10 elapsed, 1/4, about 0:30 left; seed 0 done",
        "eager, compile, 4 seeds: 0:40 elapsed, 2/4, about 0:40 left", "eager, compile, 4 seeds: done in 0:40"]


def test_past_its_estimate_a_task_says_so_and_a_stopped_one_says_stopped(log, monkeypatch):
    now = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    task = Task(Progress(), "explain", "profiling compile", estimate_s=20.0, tick=False)
    now[0] = 5.0
    assert task.status() == "0:05 elapsed, about 0:15 left"
    now[0] = 25.0
    assert task.status() == "0:25 elapsed, past the estimate of 0:20"
    with pytest.raises(KeyboardInterrupt), task:
        raise KeyboardInterrupt
    assert log.lines[-1] == ("explain", "profiling compile: stopped in 0:25")


def test_on_a_terminal_a_bar_shows_the_elapsed_time_and_goes_when_the_task_ends(monkeypatch):
    buf = io.StringIO()
    shown = progress.show_on_stderr(False)
    monkeypatch.setattr(LOGGER.handlers[0], "console", Console(file=buf, force_terminal=True,
                                                                          color_system=None, width=100))
    monkeypatch.setattr(progress, "TICK_S", 0.01)
    try:
        with shown.scoped("learns-check").task("300 steps", estimate_s=60.0):
            time.sleep(0.1)
            shown("step 30/300, loss 2.9", "learns-check")  # a line printed above the bar
    finally:
        progress.show_on_stderr(True)
    out = buf.getvalue()
    assert out.count("learns-check 300 steps ") >= 3  # the bar, redrawn by the ticker while the work runs
    assert out.count("0:00 elapsed, about 1:00 left") >= 3
    assert "step 30/300, loss 2.9" in out and "300 steps: done in 0:00" in out


def test_quiet_progress_and_a_plain_callback_show_nothing_and_start_no_thread(log):
    with Progress(quiet=True).scoped("compile").task("the first step") as task:
        assert not task.ticking
        task.advance()
    with task_of(lambda message: None, "the first step") as task:
        assert not task.ticking
    with task_of(Progress().scoped("compile"), "the first step", shown=False) as task:
        assert not task.ticking
    assert log.lines == []


# -- max-autotune's tables: in the run's log file, one line on the terminal ----------------------------------------

# Two of the tables max-autotune wrote to stderr on the H200 of 2026-12-04 (at 837fae3), cut to three choices each,
# and the record its logger wrote for a choice that failed.
H200_TABLES = """Autotune Choices Stats:
{"num_choices": 22, "num_triton_choices": 20, "best_kernel": "triton_mm_17", "best_time": 0.03206399828195572}
AUTOTUNE addmm(8192x1536, 8192x512, 512x1536)
strides: [0, 1], [512, 1], [1, 512]
dtypes: torch.bfloat16, torch.bfloat16, torch.bfloat16
  triton_mm_17 0.0321 ms 100.0% ACC_TYPE='tl.float32', ALLOW_TF32=True, BLOCK_K=64, BLOCK_M=128, BLOCK_N=128
  triton_mm_11 0.0357 ms 89.9% ACC_TYPE='tl.float32', ALLOW_TF32=True, BLOCK_K=64, BLOCK_M=64, BLOCK_N=128
  addmm 0.0477 ms 67.2%
SingleProcess AUTOTUNE benchmarking takes 10.4233 seconds and 0.0003 seconds precompiling for 22 choices
AUTOTUNE bmm(512x128x64, 512x64x128)
strides: [8192, 64, 1], [8192, 128, 1]
dtypes: torch.bfloat16, torch.bfloat16
  triton_bmm_32 0.0132 ms 100.0% ACC_TYPE='tl.float32', ALLOW_TF32=True, BLOCK_K=64, BLOCK_M=64, BLOCK_N=128
  triton_bmm_29 0.0132 ms 99.5% ACC_TYPE='tl.float32', ALLOW_TF32=True, BLOCK_K=32, BLOCK_M=64, BLOCK_N=128
  triton_bmm_28 0.0135 ms 97.4% ACC_TYPE='tl.float32', ALLOW_TF32=True, BLOCK_K=64, BLOCK_M=64, BLOCK_N=64
SingleProcess AUTOTUNE benchmarking takes 4.4627 seconds and 0.0004 seconds precompiling for 21 choices
"""
H200_FAILED = ("Runtime error during autotuning: No valid triton configs. OutOfMemoryError: out of resource: "
               "triton_mm Required: 262144 Hardware limit:232448. Ignoring this choice.")


def _write_lines(text: str) -> None:
    for line in text.splitlines(keepends=True):
        sys.stderr.write(line)


def inductor_printer() -> Callable[[str], None]:
    """A printer that writes as inductor's select_algorithm does: line by line, straight to sys.stderr, from a module
    named under torch._inductor (the function's globals are that module's)."""
    return types.FunctionType(_write_lines.__code__, {"__name__": "torch._inductor.select_algorithm", "sys": sys})


def test_autotuning_tables_go_to_the_run_folder_and_one_line_to_the_terminal(tmp_path):
    from speedladder.measure import autotune

    said: list[str] = []
    terminal = io.StringIO()
    path = tmp_path / autotune.LOG
    printer = inductor_printer()
    real, sys.stderr = sys.stderr, terminal
    try:
        with autotune.to_log(path, said.append):
            printer(H200_TABLES)
            logging.getLogger("torch._inductor.select_algorithm").error(H200_FAILED)
            print("a progress bar's line", file=sys.stderr)  # anyone else's: through, as before
        printer("after: not captured\n")
    finally:
        sys.stderr = real
    assert terminal.getvalue() == "a progress bar's line\nafter: not captured\n"
    saved = path.read_text()
    assert saved.startswith(H200_TABLES) and saved.count("AUTOTUNE ") == 4  # two tables, two timings
    assert f"ERROR torch._inductor.select_algorithm: {H200_FAILED}" in saved
    assert said == [f"autotuned 2 matmul shapes in 15 s, tables in {path} (and 1 log record)"]
    # Nothing autotuned, nothing said and no file; the loggers are left as they were.
    quiet = tmp_path / "quiet.log"
    with autotune.to_log(quiet, said.append):
        pass
    assert len(said) == 1 and not quiet.exists()
    assert not logging.getLogger("torch._inductor.select_algorithm").filters


def test_a_rung_that_autotunes_leaves_its_tables_in_the_run_folder(tmp_path, log, monkeypatch):
    """The ladder captures around each rung: what inductor prints while the rung is measured goes to RUN/autotune.log,
    and the rung's progress says one line."""
    from speedladder.config.run import ProfileConfig, RunConfig
    from speedladder.ladder.climb import Ladder
    from speedladder.rungs import RUNGS
    from speedladder.step.workload import prepare

    work = prepare(RunConfig(preset="tiny", device="cpu", profile=ProfileConfig(enabled=False)))
    ladder = Ladder(work, tmp_path, progress=Progress())
    printer = inductor_printer()

    def measure(r, spec, base, say) -> None:
        printer(H200_TABLES)
        r.status = "ok"

    monkeypatch.setattr(ladder, "_measure", measure)
    ladder.climb(RUNGS["eager"], work.base_spec, None)
    assert (tmp_path / "autotune.log").read_text() == H200_TABLES
    assert ("eager", f"autotuned 2 matmul shapes in 15 s, tables in {tmp_path / 'autotune.log'}") in log.lines
