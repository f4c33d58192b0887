"""Options and behaviour shared by every subcommand.

--config FILE (YAML; flags given on the command line win), --dump-config,
--quiet, and the device/dtype/seed trio for commands that run models.
"""

from __future__ import annotations

import sys
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


def dtype_option(default: str = "fp32", auto: bool = False):
    extra = " auto: bf16 where the device has fast bf16 units (AMX / AVX-512 BF16 CPUs, bf16 GPUs), else fp32." \
        if auto else ""
    return typer.Option(default, "--dtype", help="Precision: autocast to bf16 or fp16 (fp16 on CUDA only), or fp32."
                        + extra)


def seed_option():
    return typer.Option(0, "--seed", min=0, max=SEED_MAX,
                        help="Random seed (same seed, device and dtype: same result).")


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
