"""`tdiff eval` as two library calls: the figures of a model (`evaluate_model`) and of generated
texts (`evaluate_samples`), each a dict with one key per group of figures. The command line checks
which options go together, calls these, and writes the JSON.

STAGE(name), when given, is told which stage starts (the command shows it on a terminal)."""

from __future__ import annotations

from tdiff.core import log, memory
from tdiff.core.errors import DataError, UsageError
from tdiff.evaluation import model_figures as F
from tdiff.evaluation import sample_figures as S
from tdiff.evaluation import speed as P
from tdiff.evaluation.records import model_kind, read_heldout_ids, read_texts


def _no_stage(name: str) -> None:
    pass


def evaluate_model(model, device, *, data=None, speed: bool = False, dtype: str = "fp32", use_ema: bool = True,
                   seed: int = 0, max_records: int = 0, t_samples: int = 4, levels=F.NOISE_LEVELS,
                   steps: int | None = None, solver: str | None = None, batch_size: int = 1, length: int = 0,
                   repeats: int = 5, warmup_batches: int = 1, compile: bool = False, stage=_no_stage) -> dict:
    """Figures of the model at MODEL (a VAE, a diffusion model or student, a train-ar directory) on
    DEVICE: with DATA (held-out ids) reconstruction, denoising and noise levels, or an AR model's
    perplexity; with SPEED the speed of sampling (`tdiff.evaluation.speed`)."""
    result: dict = {}
    kind = model_kind(model)
    if kind == "ar":
        from tdiff.formats.ar_dir import load_ar

        if compile:
            raise UsageError("--compile: diffusion models only, not a train-ar directory")
        ar_model, ar_tok = load_ar(model, device)
        if data is not None:
            seqs = read_heldout_ids(data, ar_tok.vocab_size, max_records)
            stage("held-out perplexity")
            result["perplexity"] = F.ar_perplexity(ar_model, seqs, device, dtype)
        if speed:
            _check_ar_memory(ar_model, batch_size, length, device)
            stage("speed")
            with memory.out_of_memory_errors("try a smaller --batch-size"):
                result["speed"] = P.speed_ar(ar_model, ar_tok, device, length=length, batch_size=batch_size,
                                             repeats=repeats, warmup=warmup_batches, seed=seed, dtype=dtype)
        return result
    from tdiff.formats.model import load_model, load_vae

    bundle = load_model(model, device, use_ema=use_ema) if kind == "model" else None
    if bundle is not None:
        vae, tok = bundle.vae, bundle.tokenizer
    else:
        vae, tok, _ = load_vae(model, device)
    if data is not None:
        seqs = read_heldout_ids(data, tok.vocab_size, max_records)
        stage("held-out reconstruction and denoising")
        result["reconstruction"] = F.reconstruction(vae, tok, seqs, device, dtype)
        if bundle is not None:
            result["denoising"] = F.denoising(bundle, seqs, device, seed=seed, t_samples=t_samples, dtype=dtype)
            if levels:
                result["noise_levels"] = F.noise_levels(bundle, seqs, device, levels, seed=seed, dtype=dtype)
    if speed:
        if bundle is None:
            raise UsageError(f"--speed: '{model}' is a VAE file, not a diffusion model")
        if length and length != vae.config.max_len:
            log.warn(f"--length {length} ignored: this diffusion model samples a fixed "
                     f"{vae.config.max_len} positions")
        from tdiff.sampling.sample import SampleOptions, check_memory, sampling_plan

        steps, solver, notes = sampling_plan(bundle, steps, solver)
        for line in notes:
            (log.warn if line.startswith("warning: ") else log.info)(f"eval: {line.removeprefix('warning: ')}")
        check_memory(bundle, SampleOptions(batch_size=batch_size), batch_size, device)
        stage("speed")
        with memory.out_of_memory_errors("try a smaller --batch-size"):
            result["speed"] = P.speed_diffusion(bundle, device, steps=steps, solver=solver, batch_size=batch_size,
                                                repeats=repeats, warmup=warmup_batches, seed=seed, dtype=dtype,
                                                compile=compile)
    return result


def read_sample_inputs(samples, *, references=None, real=None, max_records: int = 0):
    """(samples, references, real texts) as TextRecords, read before any model loads: a missing or
    malformed file fails first. Real texts default to the references."""
    smp = read_texts(samples, max_records=max_records, opt="--samples")
    if not smp.texts:
        raise DataError(f"{smp.path}: no sample records")
    refs = read_texts(references, max_records=max_records, opt="--references") if references is not None else None
    real_recs = read_texts(real, max_records=max_records, opt="--real") if real is not None else refs
    return smp, refs, real_recs


def evaluate_samples(smp, device=None, *, refs=None, real_recs=None, judge=None, train=None, classifier=None,
                     seed: int = 0, dtype: str = "fp32", stage=_no_stage) -> dict:
    """Figures of the generated texts SMP (`read_sample_inputs`): diversity and length always; control
    figures where the records are controlled; label accuracy under CLASSIFIER; the JUDGE's (a train-ar
    directory) perplexity, with REAL_RECS its q; memorization against TRAIN; BLEU/ROUGE-L against REFS."""
    stage("samples")
    result: dict = {}
    real_texts = real_recs.texts if real_recs is not None else None
    judge_model = judge_tok = None
    if judge is not None:
        from tdiff.formats.ar_dir import load_ar

        judge_model, judge_tok = load_ar(judge, device)
    result["samples"] = S.sample_metrics(smp.texts, smp.ids, judge_tok, real_texts)
    if smp.requests is not None:
        result["control"] = S.control_metrics(smp.texts, smp.requests)
    if classifier is not None:
        result["labels"] = S.label_accuracy(smp.texts, smp.labels or [], classifier, where=smp.path)
    if judge_model is not None:
        result["judge"] = S.judge_metrics(judge_model, judge_tok, smp.texts, real_texts, seed=seed, device=device,
                                          dtype=dtype)
    if train is not None:
        result["memorization"] = S.memorization(smp, train)
    if refs is not None:
        result["references"] = S.reference_metrics(smp.texts, refs.texts)
        if len(refs.texts) != len(smp.texts):
            log.warn(f"{len(smp.texts)} samples but {len(refs.texts)} references: BLEU and ROUGE-L pair "
                     f"the first {min(len(smp.texts), len(refs.texts))} in order")
    return result


def _check_ar_memory(model, batch_size: int, length: int, device) -> None:
    """--speed on an AR model: a UsageError naming --batch-size when its KV cache cannot fit DEVICE
    (LENGTH new tokens; 0: 128 or what fits, as `speed.speed_ar` takes it)."""
    from tdiff.sampling.ar import check_memory

    check_memory(model, batch_size, 1 + min(length or 128, model.config.n_positions - 1), device, batch_size)
