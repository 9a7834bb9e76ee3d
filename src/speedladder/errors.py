"""Errors: the exception types the command line turns into a one-line message and exit 2 (a usage error, a rung's),
and how any other exception is told in one line."""


class UsageError(Exception):
    """Bad input from the user: a flag, a name, a file. Shown as one line; exit status 2."""


class RungError(UsageError):
    """A rung declared wrongly, or a user's rung that failed: one line, exit 2."""


def is_oom(e: BaseException) -> bool:
    """An out-of-memory error of any device (CUDA's own type, or the allocator's message elsewhere)."""
    return type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e).lower()


def one_line(e: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]
