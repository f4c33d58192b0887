"""The `tdiff` command: a thin Typer layer over the library.

Each subcommand lives in tdiff/cli/commands/<name>.py and is registered here.
`main()` turns user errors into one line on stderr and a documented exit code,
and exits quietly when the reader of stdout goes away (`tdiff ... | head`).
"""

from __future__ import annotations

import os
import sys

import typer

from tdiff.core.version import __version__
from tdiff.core.errors import EXIT_FAILURE, EXIT_IOERR, EXIT_SIGTERM, TdiffError

app = typer.Typer(
    name="tdiff",
    help="Text diffusion language models from the command line: "
    "clean, tokenize, train, sample, evaluate. Data on stdin/stdout, logs on stderr.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool):
    if value:
        sys.stdout.write(f"tdiff {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
):
    """Text diffusion language models from the command line."""


def _register() -> None:
    from tdiff.cli.commands import registry

    for name, func in registry.COMMANDS:
        app.command(name)(func)


_register()


def _quiet_broken_pipe() -> None:
    """Python's 'Note on SIGPIPE': point stdout at devnull so the exit flush cannot fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


class _Terminated(BaseException):
    """SIGTERM outside training, raised so that cleanups (temp files) run before exit 143."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def _strict_numbers(cmd) -> None:
    """Every int or float option of every subcommand, on the command line or from --config's YAML,
    refuses a boolean (YAML `true` is not 1) and a float option refuses nan and ±inf, each with its
    own reason ("not a finite number"), before any range check runs; an option with an open lower
    end (common.above) refuses that end too, and says so in --help."""
    import math
    import types

    def process_value(self, ctx, value, _orig=None):
        kind = self.type_descriptor.annotation
        if isinstance(value, bool):
            raise typer.BadParameter(f"{str(value).lower()} is a boolean, not a number", ctx=ctx, param=self)
        if kind is float and value is not None:
            try:
                x = float(value)
            except (TypeError, ValueError):
                x = 0.0                                    # not a number at all: the type check says so
            if not math.isfinite(x):
                raise typer.BadParameter(f"{value} is not a finite number", ctx=ctx, param=self)
        value = _orig(ctx, value)
        bound = _greater_than(self)
        if bound is not None and value is not None and value <= bound:
            raise typer.BadParameter(f"Input should be greater than {bound}", ctx=ctx, param=self)
        return value

    for sub in getattr(cmd, "commands", {}).values():
        for p in sub.params:
            if getattr(getattr(p, "type_descriptor", None), "annotation", None) in (int, float) and not p.multiple:
                p.process_value = types.MethodType(
                    lambda self, ctx, value, _o=p.process_value: process_value(self, ctx, value, _o), p)
                if _greater_than(p) is not None:           # --help shows the open end: 0.0<x<=1.0
                    p._get_number_range_help_str = types.MethodType(
                        lambda self: f"{_greater_than(self)}<x" + (f"<={self.max}" if self.max is not None else ""), p)


def _greater_than(param):
    """The open lower bound an option was given with common.above(), or None."""
    return getattr(getattr(param.type_descriptor, "parameter_info", None), "greater_than", None)


def _invoke(argv):
    """Parse ARGV and run the subcommand; its return value, or the code of an explicit exit.

    Click's own main loop is bypassed on purpose: it turns a closed stdout pipe (EPIPE) into
    exit 1 before we can see it, and `tdiff … | head` must exit 0."""
    cmd = typer.main.get_command(app)
    _strict_numbers(cmd)
    try:
        args = list(sys.argv[1:] if argv is None else argv)
        with cmd.make_context("tdiff", args, obj={"argv": args}) as ctx:
            return cmd.invoke(ctx)
    except typer.Exit as e:  # --help, --version, --dump-config
        return e.exit_code


class _ClosedStream:
    """Stands for a standard stream that was closed before start (`tdiff clean >&-`: Python sets
    sys.stdout to None): writing to it is an OSError (EBADF), so a command that needs it fails with
    one line and exit 74; a command that writes elsewhere (-o FILE) runs as usual."""

    def __init__(self, name: str):
        self.name = name

    def write(self, data):
        import errno

        raise OSError(errno.EBADF, f"standard {self.name} is closed", f"<std{self.name[:3]}>")

    def flush(self):
        pass

    def fileno(self):
        raise ValueError(f"standard {self.name} is closed")

    def isatty(self):
        return False


def main(argv: list[str] | None = None) -> None:
    import signal

    if sys.stdout is None:
        sys.stdout = _ClosedStream("output")
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")            # nowhere to report: errors still set the exit code

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(encoding="utf-8")
        except (AttributeError, ValueError):
            pass
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (an embedding program): leave signals alone
        pass
    try:
        try:
            # standalone_mode=False: errors reach us, so a closed pipe exits 0 quietly
            # instead of click's exit 1, whatever the command.
            rv = _invoke(argv)
        finally:
            sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
        sys.exit(rv if isinstance(rv, int) else 0)
    except TdiffError as e:
        sys.stderr.write(f"tdiff: error: {e}\n")
        sys.exit(e.exit_code)
    except BrokenPipeError:
        _quiet_broken_pipe()
        sys.exit(0)
    except KeyboardInterrupt:
        sys.stderr.write("tdiff: interrupted\n")
        sys.exit(130)
    except _Terminated:
        sys.stderr.write("tdiff: terminated\n")
        sys.exit(EXIT_SIGTERM)
    except MemoryError:
        sys.stderr.write("tdiff: error: out of memory (try a smaller --batch-size)\n")
        sys.exit(EXIT_FAILURE)
    except OSError as e:  # a full disk, a vanished folder: one line, exit 74
        where = f": {e.filename}" if getattr(e, "filename", None) else ""
        sys.stderr.write(f"tdiff: error: {e.strerror or e}{where}\n")
        _quiet_broken_pipe()  # stdout may hold unwritable bytes: do not retry them at exit
        sys.exit(EXIT_IOERR)
    except Exception as e:
        if hasattr(e, "show") and hasattr(e, "exit_code"):  # click's usage errors: message, exit 2
            e.show()
            sys.exit(e.exit_code)
        if type(e).__name__ == "Abort":
            sys.stderr.write("tdiff: aborted\n")
            sys.exit(EXIT_FAILURE)
        from tdiff.core.memory import is_out_of_memory

        if is_out_of_memory(e):                   # torch's allocators: one line, never a traceback
            sys.stderr.write("tdiff: error: out of memory (try a smaller --batch-size)\n")
            sys.exit(EXIT_FAILURE)
        raise
