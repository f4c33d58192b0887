"""Errors that reach the user as one line and a documented exit code.

Exit codes (sysexits-style, documented in man/tdiff.1):
  0 success, 1 anything else, 2 usage error, 65 bad input data (EX_DATAERR),
  66 input file missing (EX_NOINPUT), 73 output cannot be created (EX_CANTCREAT),
  74 read or write failed, e.g. a full disk (EX_IOERR), 130 / 143 interrupted by
  SIGINT / SIGTERM (a training checkpoint is written first).
"""

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_DATAERR = 65
EXIT_NOINPUT = 66
EXIT_CANTCREAT = 73
EXIT_IOERR = 74
EXIT_SIGINT = 130
EXIT_SIGTERM = 143


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


class OutputError(TdiffError):
    """An output that cannot be created: a directory, a missing or read-only place (exit 73)."""

    exit_code = EXIT_CANTCREAT


class Interrupted(TdiffError):
    """Stopped by a signal (exit 130 for SIGINT, 143 for SIGTERM), after saving what can be saved."""

    def __init__(self, message: str, signum: int):
        import signal

        super().__init__(message, EXIT_SIGTERM if signum == signal.SIGTERM else EXIT_SIGINT)


class AfterTrainingError(TdiffError):
    """A step after training failed (held-out figures, writing the output, a conversion) while the
    trained weights are safe in CHECKPOINT. The command layer adds the command that finishes the job."""

    def __init__(self, message: str, checkpoint, exit_code: int = EXIT_FAILURE):
        super().__init__(message, exit_code)
        self.checkpoint = checkpoint


class ConfigError(ValueError):
    """A bad value in a stored configuration (a network, a schedule, a time warp): FIELD, the key at
    fault ("" for the whole), and PROBLEM, what is wrong with it (a phrase such as "must be >= 1,
    got 0"). Not a user-facing error by itself: a loader (tdiff/formats/model.py) turns it into a DataError
    naming the file and the full field; str() reads "<WHAT>: <field> <problem>"."""

    def __init__(self, what: str, field: str, problem: str):
        super().__init__(f"{what}: {field} {problem}" if field else f"{what}: {problem}")
        self.field, self.problem = field, problem


def require(ok: bool, what: str, field: str, problem: str) -> None:
    """Raise ConfigError(WHAT, FIELD, PROBLEM) unless OK."""
    if not ok:
        raise ConfigError(what, field, problem)
