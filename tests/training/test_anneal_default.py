"""--max-minutes anneals by default in every trainer (the cosine decay follows the time budget)."""

import pytest
import yaml

from conftest import run_cli


REQUIRED = {"train-vae": ["-i", "x", "-o", "y", "-t", "t"], "train": ["-i", "x", "-o", "y", "--vae", "v"],
            "train-ar": ["-i", "x", "-o", "y", "-t", "t"], "distill": ["-i", "x", "-o", "y", "-m", "m"]}


@pytest.mark.parametrize("command", sorted(REQUIRED))
def test_every_trainer_decays_over_its_budget_by_default(command):
    r = run_cli([command, "--dump-config", *REQUIRED[command]])
    assert r.returncode == 0, r.stderr
    cfg = yaml.safe_load(r.stdout)
    assert cfg["lr_decay"] == "budget"
    r = run_cli([command, "--dump-config", *REQUIRED[command], "--lr-decay", "steps"])
    assert yaml.safe_load(r.stdout)["lr_decay"] == "steps"
