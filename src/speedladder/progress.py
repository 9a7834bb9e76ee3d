"""Progress lines for the long phases (compilation, warm-up, windows, learns-check), on stderr.

Only ever called outside timed windows or at their edges, so it costs the
measurement nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape


class Progress:
    def __init__(self, quiet: bool = False) -> None:
        self.console = Console(stderr=True, highlight=False)
        self.quiet = quiet
        self.start = time.perf_counter()

    def __call__(self, message: str, phase: str = "") -> None:
        if self.quiet:
            return
        elapsed = int(time.perf_counter() - self.start)
        head = f"[dim]{elapsed // 60:02d}:{elapsed % 60:02d}[/dim] "
        if phase:
            head += f"[bold]{escape(phase)}[/bold] "
        self.console.print(head + escape(message), soft_wrap=True)

    def scoped(self, phase: str) -> Callable[[str], None]:
        """A progress callback that names its phase."""
        return lambda message: self(message, phase)
