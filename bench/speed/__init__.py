"""Generation-speed benchmarks: tdiff against a same-size GPT-2, and where the time goes."""
