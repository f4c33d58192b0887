"""Errors that reach the user as one line and a documented exit code.

Exit codes (sysexits-style, documented in man/tdiff.1):
  0 success, 1 anything else, 2 usage error, 65 bad input data (EX_DATAERR),
  66 input file missing (EX_NOINPUT).
"""

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_DATAERR = 65
EXIT_NOINPUT = 66


class TdiffError(Exception):
    """A user-facing error: printed as one line, no traceback."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(TdiffError):
    """A bad option value or combination (exit 2)."""

    exit_code = EXIT_USAGE


class DataError(TdiffError):
    """Malformed input data: bad JSONL, invalid UTF-8 under --strict, wrong checkpoint (exit 65)."""

    exit_code = EXIT_DATAERR


class NoInputError(TdiffError):
    """An input file that does not exist (exit 66)."""

    exit_code = EXIT_NOINPUT
