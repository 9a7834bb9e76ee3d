"""Progress lines for the long phases (compilation, warm-up, windows, learns-check), through `logging`.

Every line goes to the "speedladder" logger at INFO level, with its phase, so
a program that uses speedladder as a library silences or redirects it as it
does any library's (`logging.getLogger("speedladder").setLevel(logging.WARNING)`).
The command line shows it on stderr (`show_on_stderr`), or not with --quiet.
Only ever called outside timed windows or at their edges, so it costs the
measurement nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape

LOGGER = logging.getLogger("speedladder")


class Progress:
    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet  # quiet: nothing is logged at all (e.g. a ladder inside another command's work)

    def __call__(self, message: str, phase: str = "") -> None:
        if not self.quiet:
            LOGGER.info(message, extra={"phase": phase})

    def scoped(self, phase: str) -> Callable[[str], None]:
        """A progress callback that names its phase."""
        return lambda message: self(message, phase)


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


def show_on_stderr(quiet: bool) -> Progress:
    """The command line's progress: lines on stderr from now on (nothing with quiet)."""
    LOGGER.handlers = [] if quiet else [_StderrLines()]
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False  # the command line prints its own lines; a root handler would print them twice
    return Progress(quiet=quiet)
