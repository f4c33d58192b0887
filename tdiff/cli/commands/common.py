"""Options and behaviour shared by every subcommand.

--config FILE (YAML; flags given on the command line win), --dump-config,
--quiet, and the device/dtype/seed trio for commands that run models.
"""

from __future__ import annotations

import copy
import functools
import inspect
import sys
import typing
from pathlib import Path
from typing import Optional

import typer

from tdiff.core import log
from tdiff.core.errors import EXIT_NOINPUT

_SKIP = {"config", "dump_config"}
SEED_MAX = 2**63 - 1      # what torch's generators take


def _load_config(ctx: typer.Context, param, value: Optional[Path]):
    """Eager callback: read a YAML mapping of option values into ctx.default_map.

    Keys may use dashes or underscores. Values become defaults, so options given
    on the command line still win. Unknown keys are a usage error (exit 2).
    """
    if value is None or ctx.resilient_parsing:
        return value
    import yaml

    p = Path(value)
    if not p.exists():
        typer.echo(f"tdiff: error: config file '{p}' does not exist (--config)", err=True)
        raise typer.Exit(EXIT_NOINPUT)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except Exception as e:  # yaml.YAMLError, UnicodeDecodeError
        raise typer.BadParameter(f"'{p}' is not valid YAML: {str(e).splitlines()[0]}", ctx, param)
    if not isinstance(data, dict):
        raise typer.BadParameter(f"'{p}' must hold a mapping of option names to values", ctx, param)
    known = {q.name for q in ctx.command.params if q.name not in _SKIP}
    defaults = {}
    for key, v in data.items():
        name = str(key).replace("-", "_")
        if name not in known:
            raise typer.BadParameter(
                f"'{p}': unknown key '{key}' (known: {', '.join(sorted(known))})", ctx, param
            )
        defaults[name] = v
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


def config_option():
    return typer.Option(
        None,
        "--config",
        help="YAML file of option values (keys as option names); options on the command line win.",
        is_eager=True,
        callback=_load_config,
        dir_okay=False,
    )


def dump_config_option():
    return typer.Option(False, "--dump-config", help="Print the effective configuration as YAML and exit.")


def quiet_option():
    return typer.Option(False, "--quiet", "-q", help="No progress or summary on stderr (errors still show).")


def device_option():
    return typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N (auto: CUDA when available).")


def compile_option():
    return typer.Option(False, "--compile", help="Diffusion models: run the denoiser and VAE decoder through "
                        "torch.compile (CUDA graphs on CUDA). Costs 10-30 s of compiling once per run; pays off "
                        "on many batches (needs a C++ compiler on CPU).")


def no_ema_option():
    return typer.Option(False, "--no-ema", help="Diffusion models: use the raw denoiser weights instead of the EMA "
                        "weights (a train-ar directory holds its EMA weights only).")


def dtype_option(default: str = "fp32", auto: bool = False):
    extra = " auto: bf16 where the device has fast bf16 units (AMX / AVX-512 BF16 CPUs, bf16 GPUs), else fp32." \
        if auto else ""
    return typer.Option(default, "--dtype", help="Precision: autocast to bf16 or fp16 (fp16 on CUDA only), or fp32."
                        + extra)


def seed_option():
    return typer.Option(0, "--seed", min=0, max=SEED_MAX,
                        help="Random seed (same seed, device and dtype: same result).")


def above(option, bound: float):
    """OPTION (a typer.Option) takes only values greater than BOUND: an open lower end, which typer's
    min cannot say. tdiff/cli/main.py refuses BOUND itself and shows the range as `BOUND<x<=max`."""
    option.greater_than = bound
    return option


def _spelling(decls) -> str:
    """An option's flags as the user writes them, short first: '-m/--model'."""
    return "/".join(sorted(decls, key=len))


def renamed(**aliases):
    """Decorator: keep the old spellings of renamed options as hidden aliases, for one release.

    ALIASES maps the old parameter name (also the old --config key) to (old flags, new parameter
    name), e.g. ``n_embd=(("--n-embd",), "d_model")``. The alias takes the new option's type and
    range, shows nowhere in --help, and its value becomes the new option's; using it prints one
    warning line on stderr, and giving both spellings (on the command line, or both keys in a
    --config file) is a usage error (exit 2). --dump-config prints the new name only."""
    def wrap(func):
        hints = typing.get_type_hints(func)
        params = [p.replace(annotation=hints.get(p.name, p.annotation))
                  for p in inspect.signature(func).parameters.values()]
        by_name = {p.name: p for p in params}
        extra = []
        for old, (flags, new) in aliases.items():
            info = copy.copy(by_name[new].default)
            info.param_decls, info.default, info.hidden, info.help = tuple(flags), None, True, None
            info.callback, info.is_eager = None, False
            extra.append(inspect.Parameter(old, params[-1].kind, default=info, annotation=by_name[new].annotation))

        @functools.wraps(func)
        def wrapper(*args, **kw):
            ctx = kw["ctx"] if "ctx" in kw else args[0]
            for old, (flags, new) in aliases.items():
                _merge_alias(ctx, kw, old, _spelling(flags), new, _spelling(by_name[new].default.param_decls))
            return func(*args, **kw)

        wrapper.__signature__ = inspect.Signature(params + extra)
        wrapper.__annotations__ = {p.name: p.annotation for p in params + extra}
        del wrapper.__wrapped__          # typer must see the new signature, not the function's own
        return wrapper

    return wrap


def _merge_alias(ctx: typer.Context, kw: dict, old: str, old_flags: str, new: str, new_flags: str) -> None:
    """Move the value of the hidden alias OLD into NEW (in KW and ctx.params), warning once;
    a usage error when both are given in the same place (command line, or --config file)."""
    from tdiff.core.errors import UsageError

    value = kw.pop(old, None)
    ctx.params.pop(old, None)
    if value is None:
        return
    given_old, given_new = (getattr(ctx.get_parameter_source(n), "name", "") for n in (old, new))
    if given_old == "DEFAULT_MAP":
        if given_new == "DEFAULT_MAP":
            raise UsageError(f"--config: give '{new}' or its old spelling '{old}', not both")
        log.warn(f"--config key '{old}' is now '{new}'; the old spelling goes in the next release")
        if given_new == "COMMANDLINE":
            return                                  # the command line wins over the file
    else:
        if given_new == "COMMANDLINE":
            raise UsageError(f"{old_flags} and {new_flags}: one option, give it once ({old_flags} is the old "
                             f"spelling of {new_flags})")
        log.warn(f"{old_flags} is now {new_flags}; the old spelling goes in the next release")
    kw[new] = ctx.params[new] = value


def effective_config(ctx: typer.Context) -> dict:
    """The command's parameters as plain YAML-able values (Paths as strings)."""
    out = {}
    for k, v in ctx.params.items():
        if k in _SKIP:
            continue
        if isinstance(v, Path):
            v = str(v)
        elif isinstance(v, tuple):
            v = list(v)
        elif hasattr(v, "value") and not isinstance(v, (int, float, str, bool)):
            v = v.value  # Enum
        out[k] = v
    return out


def _check_finite(ctx: typer.Context) -> None:
    """Every float option refuses nan and ±inf (from the command line or --config): exit 2 naming it."""
    import math

    from tdiff.core.errors import UsageError

    for p in ctx.command.params:
        v = ctx.params.get(p.name)
        if isinstance(v, float) and not math.isfinite(v):
            flag = max(getattr(p, "opts", None) or [f"--{p.name.replace('_', '-')}"], key=len)
            raise UsageError(f"{flag}: {v} is not a finite number")


# The parameters that name input files (any command): an output may not be one of them.
INPUT_PARAMS = ("input", "model", "tokenizer", "vae", "align", "encoder", "data", "judge", "real", "references",
                "samples", "train")


def _flag(ctx: typer.Context, name: str) -> str:
    """PARAM's flags as the user writes them, e.g. '-m/--model'."""
    for p in ctx.command.params:
        if p.name == name:
            return "/".join(sorted(p.opts, key=len))
    return name


def start(ctx: typer.Context) -> None:
    """Handle --dump-config and --quiet; call first in every command."""
    from tdiff.training import distributed

    params = ctx.params
    main = distributed.env_is_main()              # under torchrun only rank 0 reports and checks outputs
    log.set_quiet(bool(params.get("quiet", False)) or not main)
    _check_finite(ctx)
    if params.get("output") is not None and not params.get("dump_config") and main:
        from tdiff.files.streams import check_output, refuse_same_file

        refuse_same_file({_flag(ctx, n): params.get(n) for n in INPUT_PARAMS if isinstance(params.get(n), (str, Path))},
                         {"-o/--output": params["output"]})
        check_output(params["output"], "-o/--output", directory=ctx.info_name in ("train-ar", "export"))
    if params.get("dump_config"):
        import yaml

        sys.stdout.write(yaml.safe_dump(effective_config(ctx), allow_unicode=True, sort_keys=False))
        raise typer.Exit(0)
