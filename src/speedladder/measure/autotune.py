"""Max-autotune's tables in the run's log file, one line on the terminal.

Inductor writes each matmul shape it autotunes straight to stderr (torch/_inductor/select_algorithm.py: "AUTOTUNE
addmm(8192x1536, ...)", its strides and dtypes, the ten best choices, "SingleProcess AUTOTUNE benchmarking takes S
seconds ...", "Autotune Choices Stats"), and logs each choice that fails to compile through its module's logger:
hundreds of lines a rung on the H200 of 2026-12-04. Around a rung, `to_log` sends what inductor's own code writes to
stderr, and those loggers' records, to a file in the run folder, and says in one line what was autotuned. Anything
else written to stderr (the progress bar, a warning) goes through as before.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TextIO, cast

LOG = "autotune.log"  # in the run folder
SOURCE = "torch._inductor"  # a write to stderr from a module under it goes to the file
LOGGERS = ("torch._inductor.select_algorithm", "torch._inductor.autotune_process")
TABLE = re.compile(r"^AUTOTUNE \w+\(", re.MULTILINE)  # one matmul shape's table begins
TOOK = re.compile(r"AUTOTUNE benchmarking takes ([\d.]+) seconds and ([\d.]+) seconds precompiling")


class Tables:
    """The file the tables go to, opened on the first line written (no tables, no file), and what they said."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.shapes = 0  # matmul shapes autotuned (tables begun)
        self.seconds = 0.0  # the tables' own benchmarking and precompiling seconds
        self.records = 0  # log records (a choice that failed, ...)
        self._file: IO[str] | None = None

    def write(self, text: str) -> None:
        self.shapes += len(TABLE.findall(text))
        self.seconds += sum(float(a) + float(b) for a, b in TOOK.findall(text))
        if self._file is None:
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(text)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def summary(self) -> str | None:
        """One line for the terminal; None when nothing was written."""
        if self._file is None:
            return None
        failed = f" (and {self.records} log record{'' if self.records == 1 else 's'})" if self.records else ""
        if not self.shapes:
            return f"the compiler's autotuning wrote to {self.path}{failed}"
        return f"autotuned {self.shapes} matmul shapes in {self.seconds:.0f} s, tables in {self.path}{failed}"


class Stderr:
    """Stands in for sys.stderr: a write from inductor's own code goes to the tables, any other to the real stderr."""

    def __init__(self, real: TextIO, tables: Tables) -> None:
        self.real, self.tables = real, tables

    def write(self, text: str) -> int:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller == SOURCE or caller.startswith(SOURCE + "."):
            self.tables.write(text)
            return len(text)
        return self.real.write(text)

    def flush(self) -> None:
        self.real.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding ...: the real stream's
        return getattr(self.real, name)


class Records(logging.Filter):
    """On inductor's autotuning loggers: each record into the tables' file, none to the terminal."""

    def __init__(self, tables: Tables) -> None:
        super().__init__()
        self.tables = tables
        self.format = logging.Formatter("%(levelname)s %(name)s: %(message)s").format

    def filter(self, record: logging.LogRecord) -> bool:
        self.tables.records += 1
        self.tables.write(self.format(record) + "\n")
        return False


@contextmanager
def to_log(path: Path, say: Callable[[str], None]) -> Iterator[Tables]:
    """While it runs, inductor's writes to stderr and its autotuning loggers' records go to `path` (appended); at
    the end, one line said when anything was written."""
    tables = Tables(path)
    real, records = sys.stderr, Records(tables)
    loggers = [logging.getLogger(name) for name in LOGGERS]
    sys.stderr = cast(TextIO, Stderr(real, tables))
    for logger in loggers:
        logger.addFilter(records)
    try:
        yield tables
    finally:
        for logger in loggers:
            logger.removeFilter(records)
        sys.stderr = real
        tables.close()
        line = tables.summary()
        if line is not None:
            say(line)
