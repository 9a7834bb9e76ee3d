"""The one exception type that the command line turns into a one-line message and exit 2."""


class UsageError(Exception):
    """Bad input from the user: a flag, a name, a file. Shown as one line; exit status 2."""
