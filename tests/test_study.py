"""training/study.py: every study command is a valid `cwsa-jax train` run with the intended config,
and run names round-trip."""

import shlex

import pytest

pytest.importorskip("flax")
pytest.importorskip("optax")

from cwsa_jax.cli import build_parser  # noqa: E402
from cwsa_jax.training import study  # noqa: E402
from cwsa_jax.training._cmd_train import config_from_args  # noqa: E402

EXPECTED = {  # variant -> (loss, label smoothing)
    "ce": ("ce", 0.0), "label_smoothing": ("ce", 0.1), "focal": ("focal", 0.0),
    "inverse_focal": ("inverse_focal", 0.0), "soft_aurc": ("soft_aurc", 0.0), "cwsa": ("cwsa", 0.0)}


def test_every_command_parses_into_the_intended_config(capsys):
  assert study.main(["--data-dir", "DATA", "--out", "runs", "--print"]) == 0
  commands = capsys.readouterr().out.splitlines()
  assert len(commands) == 2 * len(study.VARIANTS) * 3
  seen = set()
  for line in commands:
    argv = shlex.split(line)
    assert argv[0] == "cwsa-jax"
    config = config_from_args(build_parser().parse_args(argv[1:]))
    out = argv[argv.index("--out") + 1]
    dataset, variant, seed = study.parse_run_name(out.split("/")[-1])
    assert (config.dataset, config.seed) == (dataset, seed)
    assert (config.loss, config.label_smoothing) == EXPECTED[variant]
    if variant == "cwsa":  # the first study's best setting per dataset
      assert config.cwsa_weight == (0.5 if dataset == "mnist" else 0.1)
      assert (config.cwsa_band is not None) == (dataset == "mnist")
    seen.add((dataset, variant, seed))
  assert len(seen) == len(commands)


def test_run_names_round_trip():
  for variant in study.VARIANTS:
    assert study.parse_run_name(study.run_name("cifar10", variant, 12)) == ("cifar10", variant, 12)
  with pytest.raises(ValueError, match="not a run name"):
    study.parse_run_name("not a run")


def test_unknown_variant_is_a_usage_error():
  with pytest.raises(SystemExit) as e:
    study.main(["--data-dir", "D", "--out", "o", "--variants", "ce,nope"])
  assert e.value.code == 2
