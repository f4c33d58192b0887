"""The names a user chooses among on the command line, importable without torch.

The command layer offers these as enumerations (the valid values show in `--help`);
the library modules that implement them check their registries against these
tuples (tests/test_layering.py), so a name added in one place and not the other fails
a test instead of a user.
"""

PRESETS = ("tiny", "small", "base")                 # models/vae.py, models/dit.py, ar.py
SCHEDULES = ("cosine", "linear", "sqrt", "learned")  # diffusion/schedules.py
TARGETS = ("v", "x0", "eps")                         # diffusion/process.py
SOLVERS = ("dpm", "ddim", "ddpm", "consistency")     # diffusion/solvers.py
LR_DECAYS = ("steps", "budget")                      # training/loop.py
DTYPES = ("fp32", "bf16", "fp16")                    # device.py
SAMPLE_DTYPES = ("auto",) + DTYPES                   # device.resolve_dtype: auto = bf16 where it is fast
EXPORT_FORMATS = ("safetensors", "export", "torchscript", "onnx")   # export.py
T_SAMPLINGS = ("uniform", "adaptive")                # training/train_dit.py, diffusion/timewarp.py
TIME_GRIDS = ("uniform", "logsnr", "warp")           # diffusion/solvers.py
DISTILL_METHODS = ("progressive", "consistency")     # training/distill.py
VAE_DECODERS = ("parallel", "contextual")         # models/vae.py (train-vae --decoder)
SAMPLE_DECODERS = ("auto",) + VAE_DECODERS         # sampling/sample.py (sample --decoder; auto: the VAE's own)
CLASSIFIERS = ("snownlp",)                          # evaluate.py (label accuracy of guided samples)
