"""Long work shows progress while it runs (progress.Task): elapsed time and an estimate, a bar on a terminal and
plain lines in a log, a ticker thread that ends with the task and never runs where work is timed."""

from __future__ import annotations

import io
import logging
import threading
import time

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
