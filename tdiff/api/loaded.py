"""tdiff from Python: `tdiff.load(path)` and what it returns.

    import tdiff
    m = tdiff.load("model.safetensors")          # or a student, or a `tdiff train-ar` directory
    texts = m.sample(n=4, steps=12, solver="dpm", prompt="春风")
    for rec in m.generate(n=1000, batch_size=64):  # the records `tdiff sample` writes, one at a time
        ...
    z = m.encode(["一段文字"])                      # diffusion models: normalized latents (B, N, D)
    m.decode(z)                                     # back to texts through the VAE decoder

The keyword arguments are the options of `tdiff sample`, named without the dashes; `tdiff sample`
itself is `load`, then `generate`, then writing each record. Errors are tdiff's own (`TdiffError`
and its kinds in tdiff.core.errors); their messages name the command-line option a value came from.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from tdiff.core.errors import DataError, UsageError


def load(path, device: str = "cpu", *, ema: bool = True):
    """The artifact at PATH, ready to sample: a `DiffusionModel` for a file of `tdiff train` or
    `tdiff distill` (kind "model" or "student"), an `ARModel` for a `tdiff train-ar` directory.
    DEVICE is "cpu", "cuda", "cuda:N" or "auto"; EMA False takes the raw training weights."""
    from tdiff.core.device import resolve_device
    from tdiff.formats.ar_dir import is_ar_dir

    dev = resolve_device(device)
    if is_ar_dir(path):
        from tdiff.formats.ar_dir import load_ar

        model, tok = load_ar(path, dev)
        return ARModel(path, model, tok, dev)
    from tdiff.formats.model import load_model

    return DiffusionModel(path, load_model(path, dev, use_ema=ema), dev)


# The bounds of the sampling options, here and on the command line (`tdiff sample` takes its ranges
# from this table): name -> (lowest, highest or None).
RANGES = {"n": (1, 10_000_000), "batch_size": (1, 65_536), "steps": (1, 100_000), "eta": (0.0, 1.0),
          "temperature": (0.0, 100.0), "length": (0, 1_000_000), "mask_len": (1, 100_000), "guidance": (0.0, 100.0),
          "segments": (1, 1000), "overlap": (0, 100_000), "max_tokens": (0, 100_000),
          "repetition_penalty": (1.0, 100.0), "top_k": (0, None), "top_p": (0.0, 1.0)}


def _check_ranges(**values) -> None:
    """Each of VALUES within its RANGES (None: not given)."""
    for name, value in values.items():
        if value is not None:
            _check_range(name, value, *RANGES[name])


def _check_range(name: str, value, lo=None, hi=None) -> None:
    """The same bounds `tdiff sample` puts on its options, for a caller from Python."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise UsageError(f"{name}={value!r}: expected a number")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise UsageError(f"{name}={value!r}: must be in [{lo if lo is not None else '-inf'}, "
                         f"{hi if hi is not None else 'inf'}]")


class DiffusionModel:
    """A latent diffusion model (kind "model") or a distilled student (kind "student")."""

    def __init__(self, path, bundle, device):
        self.path = Path(path)
        self.bundle = bundle
        self.device = device
        self.kind = bundle.kind
        self.tokenizer = bundle.tokenizer
        self._in_dtype = {}              # dtype -> the bundle with its linear weights stored in it (eager sampling)

    @property
    def config(self) -> dict:
        """The configuration stored in the file (VAE, DiT, diffusion, schedule, labels, student)."""
        return self.bundle.config

    @property
    def window(self) -> int:
        """Tokens per generated window (the VAE's max_len)."""
        return self.bundle.vae.config.max_len

    def __repr__(self) -> str:
        return f"<tdiff {self.kind} {self.path} window={self.window} on {self.device}>"

    def plan(self, steps: int | None = None, solver: str | None = None) -> tuple[int, str, list[str]]:
        """(steps, solver, notes): what sampling will use when STEPS/SOLVER are None (a student's own,
        else 12 dpm), and notes on the choice (lines starting "warning: " are warnings)."""
        from tdiff.sampling.sample import sampling_plan

        return sampling_plan(self.bundle, steps, solver)

    def generate(self, n: int = 1, *, steps: int | None = None, solver: str | None = None, eta: float = 0.0,
                 temperature: float | None = None, top_k: int = 0, top_p: float = 1.0, length: int = 0,
                 prompt: str | None = None, infill: str | None = None, edit: str | None = None, mask_len: int = 8,
                 requests=None, label: str | None = None, guidance: float = 0.0, segments: int = 1,
                 overlap: int = 0, repetition_penalty: float = 1.0, time_grid: str = "uniform",
                 round_x0: bool = False, batch_size: int = 16, seed: int = 0, dtype: str = "auto",
                 compile: bool = False, requests_name: str = "requests", decoder: str = "auto",
                 max_tokens: int = 0):
        """Yield the records `tdiff sample` writes ({"text", "ids", "index", "seed", "steps", "solver", …}):
        N unconditional samples, or N for each control request. PROMPT / INFILL / EDIT / LENGTH / LABEL
        describe one request (the syntax of `tdiff sample`, man tdiff-sample); REQUESTS is an iterable
        of (line number, record dict) pairs, each generated N times (REQUESTS_NAME names them in errors).
        TEMPERATURE None is 0 (greedy decoding of the VAE logits). MAX_TOKENS (block-causal models): sample
        block by block up to this many tokens, past the window too, each text ending at its end-of-text
        prediction (0: the window). Same seed, batch size, device and dtype → the same records, byte for byte."""
        from tdiff.core import log
        from tdiff.core.device import resolve_dtype, torch_dtype
        from tdiff.sampling.sample import SampleOptions, check_decoder, check_length, check_memory, check_options, \
            check_spans, generate, generate_long

        temperature = 0.0 if temperature is None else temperature
        _check_ranges(n=n, batch_size=batch_size, steps=steps, eta=eta, temperature=temperature, length=length,
                      mask_len=mask_len, guidance=guidance, segments=segments, overlap=overlap,
                      repetition_penalty=repetition_penalty, top_k=top_k, top_p=top_p, max_tokens=max_tokens)
        if requests is not None and any(v is not None for v in (prompt, infill, edit)):
            raise UsageError("--input: the requests come from the file; drop --prompt/--infill/--edit")
        dtype = resolve_dtype(dtype, self.device)
        torch_dtype(dtype)
        steps, solver, notes = self.plan(steps, solver)
        for line in notes:
            if line.startswith("warning: "):
                log.warn(f"sample: {line[len('warning: '):]}")
            else:
                log.info(f"sample: {self.path}: {line}")
        opts = SampleOptions(num=n, batch_size=batch_size, steps=steps, solver=solver, eta=eta,
                             temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, dtype=dtype,
                             time_grid=time_grid, round_x0=round_x0, guidance=guidance,
                             repetition_penalty=repetition_penalty, decoder=decoder, max_tokens=max_tokens)
        check_options(opts)
        check_decoder(self.bundle, opts)
        check_length(self.bundle, opts, segments)
        todo = self._requests(requests, n, prompt=prompt, infill=infill, edit=edit, length=length,
                              mask_len=mask_len, label=label, name=requests_name)
        first, todo = _first_batch(todo, batch_size, n)
        check_memory(self.bundle, opts, first, self.device)          # before a batch is allocated
        from tdiff.sampling.precision import for_sampling

        if compile:                      # compiled for this run's batch size
            bundle = for_sampling(self.bundle, self.device, dtype, batch_size * (2 if guidance else 1), compile)
            log.info("sample: --compile: the first batch compiles the networks (10-30 s)")
        else:                            # prepared once per dtype: a loop of generate calls copies no weights
            if dtype not in self._in_dtype:
                self._in_dtype[dtype] = for_sampling(self.bundle, self.device, dtype, batch_size)
            bundle = self._in_dtype[dtype]
        how = f"{solver} {steps} steps on {self.device}, {dtype}{', compiled' if compile else ''}"
        if segments > 1:
            check_spans(bundle)                                       # later windows continue through known spans
            return Records(generate_long(bundle, opts, self.device, todo, segments=segments,
                                         overlap=overlap or self.window // 4), how)
        return Records(generate(bundle, opts, self.device, todo), how)

    def sample(self, n: int = 1, **options) -> list[str]:
        """The texts of `generate(n, **options)`: a list of N strings (N per request with REQUESTS)."""
        return [rec["text"] for rec in self.generate(n, **options)]

    def _requests(self, requests, num, *, prompt, infill, edit, length, mask_len, label, name):
        """The templates to generate (tdiff/sampling/control.py): each of REQUESTS' records, or the one
        of the options, NUM times; None for plain unconditional samples."""
        from tdiff.sampling import control
        from tdiff.sampling.sample import check_spans, label_index

        bundle, window, tok = self.bundle, self.window, self.tokenizer
        if requests is None:
            if prompt is None and infill is None and edit is None and not length and label is None:
                return None
            t = control.from_options(tok, window, prompt=prompt, infill=infill, edit=edit, length=length,
                                     mask_len=mask_len, label=label)
            label_index(bundle, label)                          # an unknown label fails before any work
            if t.conditional:
                check_spans(bundle)
            return itertools.repeat(t, num)
        label_index(bundle, label)
        if length > window:
            raise UsageError(f"--length {length}: more than the model's window of {window} tokens")

        def records():
            for line, rec in requests:
                if length and "length" not in rec and "mask" not in rec:
                    rec = {**rec, "length": length}
                t = control.from_record(rec, tok, window, name, line, mask_len)
                if t.label is None:
                    t.label = label
                else:                                         # the record's own label is data: file:line, exit 65
                    label_index(bundle, t.label, f"{name}:{line}: 'label'", DataError)
                for _ in range(num):
                    yield t

        return records()

    def encode(self, texts: list[str], batch_size: int = 256):
        """Normalized VAE latents (B, N, D) of TEXTS (each cut to the window), on the model's device."""
        from tdiff.data.latents import encode_latents

        tok = self.tokenizer
        seqs = [tok.encode(t)[: self.window] for t in texts]
        return encode_latents(self.bundle.vae, seqs, self.window, tok.pad_id, self.device, batch_size)

    def decode(self, latents, temperature: float = 0.0, seed: int = 0) -> list[str]:
        """The texts the VAE decoder reads from normalized LATENTS (B, N, D), cut where the pads begin."""
        from tdiff.core.seeds import generator
        from tdiff.sampling.sample import SampleOptions, latents_to_ids, trim_ids

        _check_ranges(temperature=temperature)
        opts = SampleOptions(temperature=temperature, seed=seed)
        ids = latents_to_ids(self.bundle, latents.to(self.device), opts, generator(seed, 0, "sample", self.device))
        return [self.tokenizer.decode(trim_ids(row, self.tokenizer)) for row in ids.cpu().tolist()]


class Records:
    """The records of one `generate` call, produced as they are iterated; HOW says how they are made
    (solver, steps, device, dtype), for a summary line."""

    def __init__(self, it, how: str):
        self._it = iter(it)
        self.how = how

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        return next(self._it)


def _first_batch(requests, batch_size: int, num: int):
    """(the size of the first batch, REQUESTS unchanged): requests are read one batch ahead, so that a
    short file is not refused for a batch size it never fills."""
    if requests is None:
        return min(batch_size, num), None
    ahead = list(itertools.islice(requests, batch_size))
    return len(ahead), itertools.chain(ahead, requests)


# The options of `DiffusionModel.generate` that an AR model cannot honour: name -> (flag, neutral value).
DIFFUSION_ONLY = {"round_x0": ("--round-x0", False), "time_grid": ("--time-grid", "uniform"),
                  "infill": ("--infill", None), "edit": ("--edit", None), "requests": ("--input", None),
                  "label": ("--label", None), "guidance": ("--guidance", 0.0),
                  "repetition_penalty": ("--repetition-penalty", 1.0), "segments": ("--segments", 1),
                  "compile": ("--compile", False), "decoder": ("--decoder", "auto"),
                  "max_tokens": ("--max-tokens", 0)}
IGNORED_BY_AR = {"steps", "solver", "eta", "mask_len", "overlap", "requests_name"}


class ARModel:
    """The autoregressive baseline of `tdiff train-ar` (a transformers GPT-2 directory)."""

    kind = "ar"

    def __init__(self, path, model, tokenizer, device):
        self.path = Path(path)
        self.model = model
        self.tokenizer = tokenizer
        self.device = device

    @property
    def config(self) -> dict:
        """The directory's tdiff.json (format, kind, training provenance) and the GPT-2 configuration."""
        from tdiff.formats.ar_dir import read_meta

        return {**(read_meta(self.path) or {}), "gpt2": self.model.config.to_dict()}

    def __repr__(self) -> str:
        return f"<tdiff ar {self.path} on {self.device}>"

    def generate(self, n: int = 1, *, length: int = 0, temperature: float | None = None, top_k: int = 0,
                 top_p: float = 1.0, prompt: str | None = None, batch_size: int = 16, seed: int = 0,
                 dtype: str = "auto", **unused):
        """Yield the records `tdiff sample` writes for a train-ar directory: transformers `generate` with
        the KV cache; LENGTH is at most this many new tokens (0: up to the model's positions); TEMPERATURE
        None is 1. Options of diffusion models only (infill, edit, requests, label, guidance, …) given a
        value other than their neutral one are a UsageError; steps, solver, eta, mask_len and overlap
        have no meaning here and are ignored."""
        from tdiff.core.device import resolve_dtype
        from tdiff.sampling import control
        from tdiff.sampling.ar import check_memory, generate_ar

        unknown = set(unused) - set(DIFFUSION_ONLY) - IGNORED_BY_AR
        if unknown:
            raise TypeError(f"generate() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
        given = [flag for name, (flag, neutral) in DIFFUSION_ONLY.items()
                 if name in unused and unused[name] != neutral]
        if given:
            raise UsageError(f"{', '.join(given)}: diffusion models only, not a train-ar directory")
        temperature = 1.0 if temperature is None else temperature
        _check_ranges(n=n, batch_size=batch_size, temperature=temperature, length=length, top_k=top_k, top_p=top_p)
        text = control.literal(prompt, "--prompt") if prompt else None
        dtype = resolve_dtype(dtype, self.device)
        ids = self.tokenizer.encode(text) if text else None
        positions = min(self.model.config.n_positions, 1 + len(ids or []) + (length or self.model.config.n_positions))
        check_memory(self.model, min(batch_size, n), positions, self.device, batch_size)

        def records():
            for rec in generate_ar(self.model, self.tokenizer, n, batch_size=batch_size, max_new_tokens=length,
                                   temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, device=self.device,
                                   dtype=dtype, prompt=ids):
                if text:
                    rec["prompt"] = text
                rec["solver"] = "ar"
                yield rec

        return Records(records(), f"on {self.device}, {dtype}")

    def sample(self, n: int = 1, **options) -> list[str]:
        """The texts of `generate(n, **options)`: a list of N strings."""
        return [rec["text"] for rec in self.generate(n, **options)]

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of TEXTS under the model's SentencePiece vocabulary."""
        return [self.tokenizer.encode(t) for t in texts]

    def decode(self, ids: list[list[int]]) -> list[str]:
        """Texts of token-id lists IDS."""
        return [self.tokenizer.decode(list(row)) for row in ids]
