"""Progress lines for the long phases (compilation, warm-up, windows, learns-check), through `logging`, and the tasks
that show long work while it runs (a compile, the explanation's profiles, the learns-check, a race's stage).

Every line goes to the "speedladder" logger at INFO level, with its phase, so
a program that uses speedladder as a library silences or redirects it as it
does any library's (`logging.getLogger("speedladder").setLevel(logging.WARNING)`).
The command line shows it on stderr (`show_on_stderr`), or not with --quiet.
Only ever called outside timed windows or at their edges, so it costs the
measurement nothing.

A `Task` shows one long piece of work with its elapsed time and an estimate of what is left: on a terminal a rich
progress bar, redrawn by a ticker thread; in a log (stderr a file or a pipe, or a library's own handler) plain
lines, one when it begins, one every LOG_EVERY_S while it runs, one per step forward and one when it ends. A task
with timed work inside (a race's stage) runs without the thread (`tick=False`) and moves only when it advances.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, TaskID, TextColumn
from rich.progress import Progress as Bar

LOGGER = logging.getLogger("speedladder")
TICK_S = 0.5  # a terminal's bar is redrawn this often while a task runs
LOG_EVERY_S = 15.0  # a log gets a line this often while a task runs with nothing else said


def clock(seconds: float) -> str:
    """Seconds as m:ss (h:mm:ss past an hour)."""
    s = round(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Task:
    """One long piece of work shown while it runs (a context manager): elapsed time and what is left, from the steps
    done out of `total`, or from `estimate_s`; elapsed time alone without either."""

    def __init__(self, progress: Progress, phase: str, what: str, total: int | None = None,
                 estimate_s: float | None = None, tick: bool = True) -> None:
        self.progress, self.phase, self.what = progress, phase, what
        self.total, self.estimate_s, self.tick = total, estimate_s, tick
        self.done = 0
        self.start = self.last_line = time.perf_counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: Bar | None = None
        self._bar_task: TaskID | None = None

    # -- what it says --------------------------------------------------------------------------------

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float | None:
        """Seconds left: at the rate so far over the steps still to do, else the estimate less the time spent;
        None when there is nothing to go by (or the estimate is spent)."""
        if self.total and self.done:
            return self.elapsed / self.done * (self.total - self.done)
        if self.estimate_s is not None and self.elapsed < self.estimate_s:
            return self.estimate_s - self.elapsed
        return None

    def status(self) -> str:
        left = self.left()
        over = (self.estimate_s is not None and left is None and not self.done
                and self.elapsed >= self.estimate_s)
        return (f"{clock(self.elapsed)} elapsed" + (f", {self.done}/{self.total}" if self.total else "")
                + (f", about {clock(left)} left" if left is not None else "")
                + (f", past the estimate of {clock(self.estimate_s or 0.0)}" if over else ""))

    # -- how it is shown -----------------------------------------------------------------------------

    def __enter__(self) -> Task:  # noqa: PYI034 -- a Task is not subclassed
        if self.progress.quiet:
            return self
        console = terminal()
        if console is not None:  # a bar that lives under the lines printed above it, gone when the task ends
            self._bar = Bar(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[status]}"),
                            console=console, transient=True, auto_refresh=False)
            self._bar_task = self._bar.add_task(f"[bold]{escape(self.phase)}[/bold] {escape(self.what)}",
                                                total=self.total or self.estimate_s, status=self.status())
            self._bar.start()
        est = f" (about {clock(self.estimate_s)})" if self.estimate_s else ""
        self.progress(f"{self.what}{est}", self.phase)
        if self.tick:
            self._thread = threading.Thread(target=self._ticker, name="speedladder-progress", daemon=True)
            self._thread.start()
        return self

    def _ticker(self) -> None:
        while not self._stop.wait(TICK_S):
            if self._bar is not None:
                self._redraw()
            elif time.perf_counter() - self.last_line >= LOG_EVERY_S:
                self.last_line = time.perf_counter()
                self.progress(f"{self.what}: {self.status()}", self.phase)

    def _redraw(self) -> None:
        if self._bar is None or self._bar_task is None:
            return
        done = float(self.done) if self.total else min(self.elapsed, 0.99 * (self.estimate_s or 0.0))
        self._bar.update(self._bar_task, completed=done, status=self.status())
        self._bar.refresh()

    def advance(self, n: int = 1, note: str = "") -> None:
        """n more steps done, with what they came to; said in a log, redrawn on a terminal."""
        self.done += n
        if self.progress.quiet:
            return
        if self._bar is not None:
            self._redraw()
            if note:
                self.progress(note, self.phase)
        else:
            self.last_line = time.perf_counter()
            self.progress(f"{self.what}: {self.status()}" + (f"; {note}" if note else ""), self.phase)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._bar is not None:
            self._bar.stop()
        if not self.progress.quiet:
            self.progress(f"{self.what}: {'done' if kind is None else 'stopped'} in {clock(self.elapsed)}",
                          self.phase)

    @property
    def ticking(self) -> bool:
        """Whether its ticker thread is running (what the timed windows must never share the process with)."""
        return self._thread is not None and self._thread.is_alive()


class Scoped:
    """A progress callback that names its phase, and starts tasks in it."""

    def __init__(self, progress: Progress, phase: str) -> None:
        self.progress, self.phase = progress, phase

    def __call__(self, message: str) -> None:
        self.progress(message, self.phase)

    def task(self, what: str, total: int | None = None, estimate_s: float | None = None, tick: bool = True) -> Task:
        return Task(self.progress, self.phase, what, total, estimate_s, tick)


def task_of(say: Callable[[str], None], what: str, total: int | None = None, estimate_s: float | None = None,
            tick: bool = True, shown: bool = True) -> Task:
    """A task in the phase of `say` when it is a Scoped callback (and `shown`); a silent one otherwise: for any other
    callback (a data-parallel rank's, a test's), or work too short to show."""
    if isinstance(say, Scoped) and shown:
        return say.task(what, total, estimate_s, tick)
    return Task(Progress(quiet=True), "", what, total, estimate_s, tick=False)


class Progress:
    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet  # quiet: nothing is logged at all (e.g. a ladder inside another command's work)

    def __call__(self, message: str, phase: str = "") -> None:
        if not self.quiet:
            LOGGER.info(message, extra={"phase": phase})

    def scoped(self, phase: str) -> Scoped:
        """A progress callback that names its phase."""
        return Scoped(self, phase)


class _StderrLines(logging.Handler):
    """Elapsed time, the phase in bold, the message: one line each, on whatever stderr is when it is written."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.console = Console(stderr=True, highlight=False)
        self.start = time.perf_counter()

    def emit(self, record: logging.LogRecord) -> None:
        elapsed = int(time.perf_counter() - self.start)
        head = f"[dim]{elapsed // 60:02d}:{elapsed % 60:02d}[/dim] "
        phase = getattr(record, "phase", "")
        if phase:
            head += f"[bold]{escape(phase)}[/bold] "
        self.console.print(head + escape(record.getMessage()), soft_wrap=True)


def terminal() -> Console | None:
    """The console the command line's lines go to, when it is a terminal: where a task draws its bar."""
    for handler in LOGGER.handlers:
        if isinstance(handler, _StderrLines) and handler.console.is_terminal:
            return handler.console
    return None


def show_on_stderr(quiet: bool) -> Progress:
    """The command line's progress: lines on stderr from now on (nothing with quiet)."""
    LOGGER.handlers = [] if quiet else [_StderrLines()]
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False  # the command line prints its own lines; a root handler would print them twice
    return Progress(quiet=quiet)
