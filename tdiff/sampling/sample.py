"""Generate text from a trained model.

noise (B, N, D) ─solver(steps)→ latents ─denormalize→ VAE decoder ─logits→
tokens (greedy, or temperature/top-k/top-p) ─cut where the pads begin (a run of 3)→ text.
"""

from __future__ import annotations

from dataclasses import dataclass

from tdiff.core.errors import UsageError


@dataclass
class SampleOptions:
    num: int = 1
    batch_size: int = 16
    steps: int = 12
    solver: str = "dpm"
    eta: float = 0.0               # ddim only
    temperature: float = 0.0       # 0: greedy decoding of the VAE logits
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    dtype: str = "fp32"
    time_grid: str = "uniform"     # uniform | logsnr | warp (the model's training time warp)
    round_x0: bool = False         # snap each x0 estimate through the VAE (decode → encode)
    guidance: float = 0.0          # classifier-free guidance weight w (label-conditional models)
    repetition_penalty: float = 1.0   # > 1: lower the logits of tokens already decoded in the row
    decoder: str = "auto"          # auto: the VAE's own; parallel: the per-position head of any VAE
    max_tokens: int = 0            # block-causal models: tokens to sample at most, past the window too (0: the window)


END_RUN = 3   # pads in a row that end a text


def trim_ids(row, tok, end_run: int = END_RUN) -> list[int]:
    """The text's token ids in a decoded ROW: up to the first run of END_RUN pads (the predicted
    end of text) or the row's end, without special ids.

    A shorter run of pads inside the text is a misdecoded token (no training text has a pad
    inside it: pads only follow the text) and is dropped rather than taken as the end: with
    the first pad as the end, one stray pad cut a sample to half its length (measured on a
    songci model: mean 26 vs 50 characters; docs/RESULTS.md, "Design measurements")."""
    out, pads = [], 0
    for i in row:
        if i == tok.pad_id:
            pads += 1
            if pads >= end_run:
                break
            continue
        pads = 0
        if i in (tok.bos_id, tok.eos_id):
            continue
        out.append(int(i))
    return out


def check_options(opts: SampleOptions) -> None:
    from tdiff.diffusion.solvers import SOLVERS

    if opts.solver not in SOLVERS:
        raise UsageError(f"--solver {opts.solver!r}: choose one of {', '.join(SOLVERS)}")
    if opts.steps < 1:
        raise UsageError("--steps must be at least 1")
    if opts.num < 0 or opts.batch_size < 1:
        raise UsageError("--num must be ≥ 0 and --batch-size ≥ 1")
    if not 0 < opts.top_p <= 1:
        raise UsageError("--top-p must be in (0, 1]")
    from tdiff.diffusion.solvers import TIME_GRIDS

    if opts.time_grid not in TIME_GRIDS:
        raise UsageError(f"--time-grid {opts.time_grid!r}: choose one of {', '.join(TIME_GRIDS)}")
    if opts.guidance < 0 or opts.repetition_penalty < 1:
        raise UsageError("--guidance must be ≥ 0 and --repetition-penalty ≥ 1")
    from tdiff.core.choices import SAMPLE_DECODERS

    if opts.decoder not in SAMPLE_DECODERS:
        raise UsageError(f"--decoder {opts.decoder!r}: choose one of {', '.join(SAMPLE_DECODERS)}")



def check_decoder(bundle, opts: SampleOptions) -> None:
    """A usage error for --decoder contextual on a VAE without that decoder."""
    if opts.decoder == "contextual" and bundle.vae.config.decoder != "contextual":
        raise UsageError("--decoder contextual: this model's VAE has only the parallel decoder "
                         "(train one with `tdiff train-vae --decoder contextual`)")


def check_length(bundle, opts: SampleOptions, segments: int = 1) -> None:
    """A usage error for --max-tokens on a model that cannot use it."""
    if not opts.max_tokens:
        return
    if not bundle.dit.config.block_causal:
        raise UsageError("--max-tokens: needs a block-causal model (train it with --block-size); a parallel model "
                         "writes longer texts with --segments")
    if segments > 1:
        raise UsageError("--max-tokens and --segments: choose one (a block-causal model goes past its window "
                         "with --max-tokens)")


def sampling_plan(bundle, steps, solver):
    """(steps, solver, notes) for BUNDLE: what the user asked (None: not given), else a student's
    own steps and solver, else 12 dpm steps. NOTES are the lines to tell the user: which defaults a
    student brought, and where a request leaves what the student was distilled for."""
    info = bundle.config.get("student") if getattr(bundle, "kind", "model") == "student" else None
    if not info:
        return (12 if steps is None else steps), ("dpm" if solver is None else solver), []
    method, own_steps, own_solver = info["method"], int(info["steps"]), info["solver"]
    notes = [f"a {method} student distilled for {own_steps} {own_solver} steps"
             + (" (its defaults)" if steps is None and solver is None else "")]
    steps = own_steps if steps is None else steps
    solver = own_solver if solver is None else solver
    if solver != own_solver:
        notes.append(f"warning: --solver {solver}: the student learned {own_solver} steps; quality is not guaranteed")
    elif method == "progressive" and steps != own_steps:
        notes.append(f"warning: --steps {steps}: a progressive student is only trained for {own_steps} steps; "
                     "quality is not guaranteed")
    return steps, solver, notes


def sample_latents(bundle, b: int, opts: SampleOptions, generator, device, callback=None,
                   label=None, cond_x=None, cond_mask=None, must=None):
    """Run the solver from N(0, I) noise; returns normalized latents (B, N, D). A block-causal
    model is sampled block by block (`sample_blocks`: (B, P, D), P positions up to its stop)."""
    import torch

    from tdiff.core.device import autocast
    from tdiff.diffusion.solvers import get_solver, time_grid

    n, d = bundle.latent_shape
    if opts.time_grid == "warp" and bundle.timewarp is None:
        raise UsageError("--time-grid warp: this model has no time warp (train it with --t-sampling adaptive)")
    ts = time_grid(opts.steps, bundle.schedule, opts.time_grid, warp=bundle.timewarp).to(device)
    kw = {"eta": opts.eta} if opts.solver == "ddim" else {}
    if bundle.dit.config.block_causal:
        return sample_blocks(bundle, b, opts, ts, generator, device, callback=callback, label=label, cond_x=cond_x,
                             cond_mask=cond_mask, must=must, **kw)
    denoise = bundle.denoiser(label=label, cond_x=cond_x, cond_mask=cond_mask, round_x0=opts.round_x0,
                              guidance=opts.guidance)
    with torch.inference_mode():
        x = torch.randn((b, n, d), generator=generator, device=device)      # (B, N, D) at t = 1
        with autocast(device, opts.dtype):
            return get_solver(opts.solver)(denoise, x, ts, bundle.schedule, generator=generator, callback=callback,
                                           **kw)


def sample_blocks(bundle, b: int, opts: SampleOptions, ts, generator, device, callback=None, label=None,
                  cond_x=None, cond_mask=None, must=None, **kw):
    """Block-causal sampling (BD3-LM, Arriola et al. 2025, Algorithm 2, in latent space): the blocks
    left to right, each denoised by the solver over the grid TS with the keys/values of the finished
    blocks cached (`DiT.extend_cache`), then appended to the cache as clean latents. A block whose
    latents are all known (a prompt's, the pads after a fixed --length) is given, not sampled; a
    partly known one is sampled with its known positions as conditioning. The noise of the window
    is drawn up front, (B, N, D), so the same seed gives the same texts at any block size's
    schedule of calls. With guidance the cache holds the conditional and the null rows (2B).

    Variable length (BD3-LM §4.1, "arbitrary-length sequence generation"): after each sampled block,
    once nothing known or required lies ahead (cond_mask, MUST (B, L): positions that must be text),
    sampling stops when every row's text has ended (`ended_rows`, asked only of the rows still
    writing, with the END_CONTEXT latents before the block); it goes on past the window up to
    OPTS.max_tokens tokens (0: the window): when the next block would leave the window, the frame
    slides so that its last `slide_keep` latents come first, and the cache is rebuilt from them block
    by block, as the model saw such context in training (positions from the frame's start).
    Returns normalized latents (B, P, D), P the positions sampled (≤ N when the texts end early)."""
    import torch

    from tdiff.core.device import autocast
    from tdiff.diffusion.solvers import get_solver

    if opts.round_x0:
        raise UsageError("--round-x0: not available for a block-causal model (a block alone does not decode)")
    dit = bundle.dit
    n, d = bundle.latent_shape
    k = bundle.vae.config.latent_stride
    bs = dit.config.block
    total = -(-opts.max_tokens // k) if opts.max_tokens else n                # P, latent positions at most
    keep = slide_keep(n, bs)
    guided = bool(opts.guidance) and label is not None
    cache_label = torch.cat([label, torch.full_like(label, -1)]) if guided else label   # (2B,) or (B,)
    solver = get_solver(opts.solver)

    def cached(x0, at, cache):
        return dit.extend_cache(torch.cat([x0, x0]) if guided else x0, at, cache, label=cache_label)

    def ahead_free(e):
        """Nothing known or required at latent positions e… (window coordinates)."""
        free_x = cond_mask is None or not bool(cond_mask[:, e:].any())
        return free_x and (must is None or not bool(must[:, e * k:].any()))

    def tail(length):
        """The last LENGTH sampled latents (B, LENGTH, D), joined from as few blocks as that takes
        (the whole sequence is joined once, at the end: a long text costs no quadratic copying)."""
        parts, got = [], 0
        for x in reversed(out):
            parts.append(x)
            got += x.shape[1]
            if got >= length:
                break
        return torch.cat(parts[::-1], dim=1)[:, got - length:]

    out, cache = [], []
    ended = torch.zeros(b, dtype=torch.bool, device=device)                  # (B,)
    with torch.inference_mode():
        noise = torch.randn((b, n, d), generator=generator, device=device)   # (B, N, D) at t = 1
        with autocast(device, opts.dtype):
            pos, frame = 0, 0                                                # next block; the frame's first latent
            while pos < total:
                if pos - frame >= n:                                         # slide: the last KEEP latents first
                    frame = pos - keep
                    ctx = tail(keep)                                         # (B, KEEP, D): latents frame…pos
                    cache = []
                    for s in range(0, keep, bs):
                        cache = cached(ctx[:, s:s + bs], s, cache)
                rel = pos - frame
                e = min(frame + min(n, rel + bs), total)                     # block = latents pos…e
                inside = e <= n                                              # the first window: cond applies
                cx = cond_x[:, pos:e] if inside and cond_x is not None else None      # (B, T, D)
                cm = cond_mask[:, pos:e] if inside and cond_mask is not None else None  # (B, T, 1)
                given = cm is not None and bool(cm.all())
                if given:
                    x0 = cx.to(noise.dtype)                                  # (B, T, D) given
                else:
                    eps = noise[:, pos:e] if inside else torch.randn((b, e - pos, d), generator=generator,
                                                                      device=device)   # (B, T, D)
                    denoise = bundle.denoiser(label=label, cond_x=cx, cond_mask=cm, guidance=opts.guidance,
                                              start=rel, cache=cache)
                    x0 = solver(denoise, eps, ts, bundle.schedule, generator=generator, callback=callback,
                                **kw)                                        # (B, T, D)
                out.append(x0)
                if e >= total:
                    break
                if not given and (not inside or ahead_free(e)):
                    live = (~ended).nonzero().squeeze(1)                     # (R,) rows still writing
                    c = max(0, pos - END_CONTEXT)
                    z = tail(e - c)[live]                                    # (R, e − c, D): latents c…e
                    m = must[live.cpu(), c * k:] if inside and must is not None else None
                    ended[live] = ended_rows(bundle, z, pos - c, e - c, m)
                    if bool(ended.all()):
                        break
                cache = cached(x0, rel, cache)
                pos = e
    return torch.cat(out, dim=1)                                             # (B, P, D)


def slide_keep(n: int, block: int) -> int:
    """Latent positions a sliding frame of N keeps as context: half the window in whole blocks, at
    least one block (so a frame moves by about half a window between cache rebuilds)."""
    return max(block, (n // 2) // block * block)


END_CONTEXT = 16   # latent positions before a block that the end-of-text check decodes with it


def ended_rows(bundle, z, s: int, e: int, must=None):
    """(B,) bool: the rows of normalized latents Z (B, P, D) whose block at latent positions s…e
    reads as the end of the text: the parallel decoder's greedy tokens hold a run of END_RUN pads
    (the rule of `trim_ids`) in the block or reaching into it. The decoder sees the block with up to
    END_CONTEXT latents before it (what follows is not sampled yet); where MUST (B, L) is true a pad
    may not be read (as in `latents_to_ids`). This check is the stop of `sample_blocks`."""
    import torch

    vae, tok = bundle.vae, bundle.tokenizer
    k = vae.config.latent_stride
    c = max(0, s - END_CONTEXT)
    first = max(c * k, s * k - (END_RUN - 1))                                  # token: runs reaching into the block
    h = vae.decode_hidden(vae.denormalize(z[:, c:e].float()))[:, first - c * k:]   # (B, R, D)
    B, R, _ = h.shape
    m = torch.zeros(B, R, dtype=torch.bool, device=h.device)
    if must is not None:
        part = must[:, first:e * k]                                          # (B, R') R' ≤ R: pads barred here
        m[:, :part.shape[1]] = part.to(h.device)
    # the reshape copies the strided slice: a strided bf16 input to the head is ~20× slower on CPU
    ids = greedy_head(vae.lm_head, h.reshape(B * R, -1), m.reshape(-1),
                      special_ids(tok, vae.lm_head.out_features, h.device))     # (B·R,)
    pads = (ids == tok.pad_id).reshape(B, R)                                 # (B, R)
    if pads.shape[1] < END_RUN:
        return torch.zeros(z.shape[0], dtype=torch.bool, device=z.device)
    return pads.unfold(1, END_RUN, 1).all(-1).any(-1)                        # (B,)


def penalize_repeats(logits, penalty: float):
    """LOGITS (B, L, V) with the logits of each row's already likely tokens lowered: every token
    that is the argmax somewhere else in the row has its logit divided by PENALTY where positive,
    multiplied where negative (CTRL's repetition penalty, Keskar et al. 2019 §4.1, applied to a
    non-autoregressive decoder: "already decoded" means the argmax at another position)."""
    import torch

    if penalty == 1.0:
        return logits
    b, L, v = logits.shape
    top = logits.argmax(-1)                                                  # (B, L)
    seen = torch.zeros(b, v, device=logits.device)
    seen.scatter_add_(1, top, torch.ones_like(top, dtype=seen.dtype))         # (B, V) argmax counts
    others = seen[:, None, :] - torch.nn.functional.one_hot(top, v).to(seen.dtype)   # (B, L, V) elsewhere
    hit = others > 0
    scaled = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(hit, scaled, logits)


GREEDY_ROWS = 4096   # positions per chunk of the eager greedy head: the (B·L, V) logits are never held at once


def special_ids(tok, vocab: int, device):
    """(V,) bool: pad, bos and eos, the ids a position that must be text may not take."""
    import torch

    banned = torch.zeros(vocab, dtype=torch.bool, device=device)
    for i in (tok.pad_id, tok.bos_id, tok.eos_id):
        if i is not None and 0 <= i < vocab:
            banned[i] = True
    return banned


def greedy_head(lm_head, h, must, banned):
    """Greedy token ids (R,) from decoder states H (R, D): the argmax of lm_head(H), with the BANNED
    (V,) ids excluded where MUST (R,) is true. `max(-1)` rather than `argmax`: the same first-index
    ids, 3× faster on CPU for (4096, 8000) logits (docs/RESULTS.md, "Inference speed levers")."""
    logits = lm_head(h)                                                        # (R, V)
    logits = logits.masked_fill(must[:, None] & banned[None, :], float("-inf"))
    return logits.max(-1).indices                                              # (R,)


def latents_to_ids(bundle, z, opts: SampleOptions, generator, must_text=None, known=None):
    """Normalized latents (B, N, D) → token ids (B, L) through the VAE decoder.

    Where MUST_TEXT (B, L) is true the decoder may not pick pad, bos or eos (inside a span to fill,
    or before a fixed end). Without it the first position is such a position: a text is at least
    one token long (no training text is empty; without this a sample whose first latent lands
    nearest the pad decodes to an empty string).

    Greedy decoding without a repetition penalty (the default) takes the V-way output layer and its
    argmax GREEDY_ROWS positions at a time (`greedy_head`; compiled where BUNDLE carries a compiled one,
    tdiff/sampling/compiled.py), never holding the (B, L, V) logits: the same ids, faster (docs/RESULTS.md,
    "Inference speed levers").

    A VAE with the contextual decoder decodes token by token (`TextVAE.decode_tokens`, the same options;
    `opts.decoder` "parallel" takes its per-position head instead); KNOWN = (ids (B, L), mask (B, L)) are
    the given tokens, forced into its context (prompts, infills)."""
    import torch

    from tdiff.core.device import autocast
    from tdiff.models.decoding import filter_logits

    tok = bundle.tokenizer
    vae = bundle.vae
    b, n, _ = z.shape
    L = n * vae.config.latent_stride
    if must_text is None:
        must_text = torch.zeros(b, L, dtype=torch.bool)
        must_text[:, 0] = True
    must_text = must_text.to(z.device)                                           # (B, L)
    with torch.inference_mode():
        banned = special_ids(tok, vae.lm_head.out_features, z.device)            # (V,)
        if vae.config.decoder == "contextual" and opts.decoder != "parallel":
            known_ids, known_mask = (k.to(z.device) for k in known) if known is not None else (None, None)
            with autocast(z.device, opts.dtype):
                return vae.decode_tokens(vae.denormalize(z.float()), temperature=opts.temperature, top_k=opts.top_k,
                                         top_p=opts.top_p, generator=generator, must_text=must_text, banned=banned,
                                         known_ids=known_ids, known_mask=known_mask,
                                         repetition_penalty=opts.repetition_penalty)
        with autocast(z.device, opts.dtype):
            h = vae.decode_hidden(vae.denormalize(z.float()))                    # (B, L, D)
        if opts.temperature <= 0 and opts.repetition_penalty == 1.0:
            flat_h, flat_must = h.reshape(b * L, -1), must_text.reshape(b * L)     # (B·L, D), (B·L,)
            compiled = getattr(bundle, "greedy_head", None)
            with autocast(z.device, opts.dtype):
                if compiled is not None:
                    ids = compiled(vae.lm_head, flat_h, flat_must, banned)
                else:
                    ids = torch.cat([greedy_head(vae.lm_head, flat_h[r:r + GREEDY_ROWS], flat_must[r:r + GREEDY_ROWS],
                                                 banned) for r in range(0, b * L, GREEDY_ROWS)])
            return ids.reshape(b, L)
        with autocast(z.device, opts.dtype):
            logits = vae.lm_head(h).float()                                       # (B, L, V)
        logits = penalize_repeats(logits, opts.repetition_penalty)
        logits = logits.masked_fill(must_text[..., None] & banned, float("-inf"))
        return filter_logits(logits, opts.temperature, opts.top_k, opts.top_p, generator)


def decode_windows(bundle, z, opts: SampleOptions, generator, must, known=None):
    """Normalized latents (B, P, D) → token ids (B, P·k), `latents_to_ids` one window of N latents
    at a time (a block-causal model's latents may run past the window, or stop before its end):
    MUST (B, L) and KNOWN (ids, mask) describe the first window; later windows continue a text."""
    import torch

    n = bundle.latent_shape[0]
    k = bundle.vae.config.latent_stride
    out = []
    for s in range(0, z.shape[1], n):
        zw = z[:, s:s + n]                                                     # (B, T, D)
        T = zw.shape[1] * k
        if s == 0:
            kn = None if known is None else tuple(x[:, :T] for x in known)
            out.append(latents_to_ids(bundle, zw, opts, generator, must_text=must[:, :T], known=kn))
        else:
            free = torch.zeros(z.shape[0], T, dtype=torch.bool)
            out.append(latents_to_ids(bundle, zw, opts, generator, must_text=free))
    return torch.cat(out, dim=1)                                               # (B, P·k)


def label_index(bundle, label, where: str = "--label", error=UsageError):
    """The model's index of label name LABEL (None: the null label, -1). An unknown label is ERROR
    (a UsageError for the --label option; a DataError naming 'file:line' for a record's label)
    naming WHERE and the known labels."""
    if label is None:
        return -1
    names = bundle.labels
    if not names:
        raise error(f"{where} {label!r}: this model has no labels (train it with --label-field)")
    if label not in names:
        raise error(f"{where} {label!r}: unknown; this model knows {', '.join(names)}")
    return names.index(label)


def check_memory(bundle, opts: SampleOptions, batch: int, device) -> None:
    """A UsageError naming --batch-size when BATCH samples cannot fit DEVICE's memory (tdiff/core/memory.py):
    the denoiser's activations (twice the batch with guidance), or the VAE decoder's with the whole
    logits where decoding samples or penalizes repeats; with --max-tokens also the latents and ids of
    every position."""
    from tdiff.core import memory

    vae, dit = bundle.vae.config, bundle.dit.config
    held = opts.temperature > 0 or opts.repetition_penalty != 1.0
    need = max(memory.activation_bytes(batch * (2 if opts.guidance else 1), dit.max_len, dit.d_model, training=False),
               memory.activation_bytes(batch, vae.max_len, vae.d_model, training=False,
                                       vocab=vae.vocab_size if held else 0))
    parts = [(need, "activations", f"--batch-size {opts.batch_size}")]
    if opts.max_tokens:                        # a block model's latents (float32) and ids (int64) of every position
        positions = -(-opts.max_tokens // vae.latent_stride)
        parts.append((batch * positions * (4 * dit.latent_dim + 8 * vae.latent_stride), "the sampled latents",
                      f"--max-tokens {opts.max_tokens}"))
    memory.check_fits(parts, device)


def check_spans(bundle) -> None:
    """A usage error when the model was not trained on known spans."""
    if not bundle.known_spans:
        raise UsageError("--prompt/--infill/--edit/--length/--segments: this model was trained without known spans "
                         "(retrain with `tdiff train --cond-prob 0.25`, the default)")


def check_guidance(bundle, opts: SampleOptions, label) -> None:
    """A usage error for guidance the model cannot give."""
    if opts.guidance and not bundle.labels:
        raise UsageError("--guidance: this model has no labels (train it with --label-field)")
    if opts.guidance and label is None:
        raise UsageError("--guidance: give the --label to steer towards")


def generate(bundle, opts: SampleOptions, device, requests=None, *, first_batch: int = 0):
    """Yield one record per request {"text", "ids", "index", "seed", "steps", "solver"} plus the
    request's own fields: REQUESTS is an iterable of tdiff.sampling.control.Template (each generated once),
    or None for OPTS.num unconditional samples.

    Batch k draws its noise from a generator seeded with derive_seed(seed, FIRST_BATCH + k):
    the same seed, batch size, device and dtype give the same records, byte for byte (timing is
    the caller's to report, on stderr).
    """
    import itertools

    import torch

    from tdiff.sampling.control import assemble, unconditional
    from tdiff.diffusion.spans import condition, force_known
    from tdiff.core.seeds import generator

    check_options(opts)
    check_decoder(bundle, opts)
    tok = bundle.tokenizer
    window = bundle.vae.config.max_len
    if requests is None:
        plain = unconditional(window)
        requests = itertools.repeat(plain, opts.num)
    it = iter(requests)
    done = 0
    k = 0
    while True:
        batch = list(itertools.islice(it, opts.batch_size))
        if not batch:
            return
        b = len(batch)
        g = generator(opts.seed, first_batch + k, "sample", device)
        cond_x = cond_mask = label = None
        known = must = ids = None
        if any(t.conditional for t in batch):
            check_spans(bundle)
            ids = torch.tensor([t.ids for t in batch], dtype=torch.long, device=device)        # (B, L)
            known = torch.tensor([t.known for t in batch], dtype=torch.bool, device=device)    # (B, L)
            with torch.inference_mode():
                cond_x, cond_mask = condition(bundle.vae, ids, known, tok.unk_id)            # (B, N, D), (B, N, 1)
        labels = [label_index(bundle, t.label) for t in batch]
        if any(i >= 0 for i in labels) or opts.guidance:
            check_guidance(bundle, opts, batch[0].label)
            label = torch.tensor(labels, dtype=torch.long, device=device)                     # (B,)
        must = torch.tensor([t.must_text for t in batch], dtype=torch.bool)                 # (B, L)
        z = sample_latents(bundle, b, opts, g, device, label=label, cond_x=cond_x, cond_mask=cond_mask,
                           must=must)                                                     # (B, P, D)
        pred = decode_windows(bundle, z, opts, g, must, None if known is None else (ids, known))   # (B, P·k)
        if pred.shape[1] < window:                                   # a block model's texts ended early
            pred = torch.cat([pred, pred.new_full((b, window - pred.shape[1]), tok.pad_id)], dim=1)   # (B, L)
        if known is not None:
            pred = torch.cat([force_known(pred[:, :window], ids, known), pred[:, window:]], dim=1)
        for i, (row, t) in enumerate(zip(pred.cpu().tolist(), batch)):
            kept = assemble(row, t, tok, trim_ids)
            rec = {**t.fields, "text": tok.decode(kept), "ids": kept, "index": done + i, "seed": opts.seed,
                   "steps": opts.steps, "solver": opts.solver}
            if t.label is not None:
                rec["label"] = t.label                  # what `tdiff eval --classifier` checks
            yield rec
        done += b
        k += 1


SEGMENT_SHIFT = 19   # window j of batch k draws sample-stream index k + j·2^19 (below the next stream's 2^30)


def generate_long(bundle, opts: SampleOptions, device, requests=None, *, segments: int, overlap: int):
    """Texts longer than the window (seed 004 §5.4): each request is generated, then SEGMENTS − 1
    times continued by a segment whose first OVERLAP tokens are the last tokens of the text so far,
    given as known tokens (the prompt mechanism) and the rest of its window generated. Only what
    follows the overlap is appended, so a join neither repeats nor drops text. Records as
    `generate`, plus "segments": the tokens each segment added."""
    import itertools

    from tdiff.sampling.control import continuation, unconditional

    window = bundle.vae.config.max_len
    if not 1 <= overlap < window:
        raise UsageError(f"--overlap {overlap}: must be between 1 and {window - 1} (the model's window is {window})")
    tok = bundle.tokenizer
    it = iter(itertools.repeat(unconditional(window), opts.num) if requests is None else requests)
    kb = 0
    while True:
        batch = list(itertools.islice(it, opts.batch_size))
        if not batch:
            return
        recs = list(generate(bundle, opts, device, batch, first_batch=kb))
        added = [[len(r["ids"])] for r in recs]
        for j in range(1, segments):
            tails = [r["ids"][-overlap:] for r in recs]
            nxt = generate(bundle, opts, device, [continuation(t, window, tok.pad_id) for t in tails],
                           first_batch=kb + (j << SEGMENT_SHIFT))
            for r, t, a, n in zip(recs, tails, added, nxt):
                new = n["ids"][len(t):]
                r["ids"] = r["ids"] + new
                a.append(len(new))
        for r, a in zip(recs, added):
            r["text"] = tok.decode(r["ids"])
            r["segments"] = a
            yield r
        kb += 1
