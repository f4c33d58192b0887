"""Files: JSONL streams read and written atomically (streams.py) and the safetensors container
every tdiff artifact uses (artifacts.py). Imports core only.
"""
