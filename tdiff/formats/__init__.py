"""One save/load pair per artifact kind: the diffusion model and student file (model.py), the
train-ar directory (ar_dir.py), the export directory (export_dir.py); `tdiff info` (info.py).
"""
