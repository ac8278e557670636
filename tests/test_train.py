"""Training loop: a tiny end-to-end run, checkpoints, kill + resume equality, CLI errors."""

import gzip
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from cwsa_jax import cli

TRAIN, TEST = 192, 64


def _write_idx(path, array):
  magic = {1: 0x801, 3: 0x803}[array.ndim]
  header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape)
  with gzip.open(path, "wb") as f:
    f.write(header + array.astype(np.uint8).tobytes())


@pytest.fixture(scope="module")
def tiny_mnist(tmp_path_factory):
  """A learnable 28x28 'MNIST' in IDX files: the label is drawn as a bright bar position."""
  root = tmp_path_factory.mktemp("mnist")
  rng = np.random.default_rng(0)
  for split, n in (("train", TRAIN), ("t10k", TEST)):
    labels = rng.integers(0, 10, n)
    images = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
    for i, y in enumerate(labels):
      images[i, 2 + 2 * y:4 + 2 * y, 4:24] = 255
    _write_idx(root / f"{split}-images-idx3-ubyte.gz", images)
    _write_idx(root / f"{split}-labels-idx1-ubyte.gz", labels)
  return root


# `cwsa-jax train ARGS` that dies like a killed process (no cleanup) right after step KILL_AT.
_KILLED_AT_STEP = r"""
import os, sys
import jax
from cwsa_jax.cli import main
from cwsa_jax.training import train

kill_at, make_train_step = int(sys.argv[1]), train.make_train_step

def make_killed_train_step(*args, **kwargs):
  step, done = make_train_step(*args, **kwargs), []

  def killed_step(*step_args):
    loss = step(*step_args)
    done.append(1)
    if len(done) == kill_at:
      jax.block_until_ready(loss)
      os._exit(17)
    return loss

  return killed_step

train.make_train_step = make_killed_train_step
sys.exit(main(["train", *sys.argv[2:]]))
"""


def _train(args, env_extra=None, check=True, kill_at_step=None):
  env = {**os.environ, "CWSA_JAX_CACHE": str(env_extra or ""), "PYTHONHASHSEED": "0"}
  command = [sys.executable, "-m", "cwsa_jax.cli", "train"]
  if kill_at_step is not None:
    command = [sys.executable, "-c", _KILLED_AT_STEP, str(kill_at_step)]
  return subprocess.run(command + list(args), capture_output=True, text=True, env=env, check=False)


def _common(data, out, cache):
  return ["--dataset", "mnist", "--data-dir", str(data), "--out", str(out), "--epochs", "2",
          "--batch-size", "32", "--seed", "3", "--no-progress"]


def test_killed_run_resumes_to_identical_results(tiny_mnist, tmp_path):
  cache = tmp_path / "cache"
  straight = _train(_common(tiny_mnist, tmp_path / "a", cache), cache)
  assert straight.returncode == 0, straight.stderr
  # 6 steps per epoch: die at step 9, after the epoch-1 checkpoint, mid epoch 2.
  killed = _train(_common(tiny_mnist, tmp_path / "b", cache), cache, kill_at_step=9)
  assert killed.returncode == 17
  assert json.loads((tmp_path / "b" / "checkpoint.json").read_text())["step"] == 6
  assert not (tmp_path / "b" / "metrics.json").exists()
  resumed = _train(_common(tiny_mnist, tmp_path / "b", cache) + ["--resume"], cache)
  assert resumed.returncode == 0, resumed.stderr
  a = json.loads((tmp_path / "a" / "metrics.json").read_text())
  b = json.loads((tmp_path / "b" / "metrics.json").read_text())
  for key in ("test_accuracy", "ece", "aurc", "eaurc", "augrc", "cwsa", "cwsa_plus", "sweep", "history"):
    assert a[key] == b[key], key
  pa, pb = np.load(tmp_path / "a" / "predictions.npz"), np.load(tmp_path / "b" / "predictions.npz")
  np.testing.assert_array_equal(pa["probs"], pb["probs"])
  np.testing.assert_array_equal(pa["labels"], pb["labels"])
  # The run learned something (the bars make the task easy) and metrics.json is complete.
  assert a["test_accuracy"] > 0.3
  assert a["steps"] == 12 and a["epochs"] == 2 and a["n"] == TEST
  assert set(a["cwsa"]) == {"0.5", "0.9"} and len(a["sweep"]["cwsa"]) == 50
  assert "idx" in a["data_source"]


def test_cwsa_loss_and_max_steps(tiny_mnist, tmp_path):
  out = tmp_path / "c"
  r = _train(_common(tiny_mnist, out, tmp_path / "cache") +
             ["--loss", "cwsa", "--max-steps", "4", "--cwsa-weight", "1.0", "--cwsa-tau", "0.6"],
             tmp_path / "cache")
  assert r.returncode == 0, r.stderr
  m = json.loads((out / "metrics.json").read_text())
  assert m["steps"] == 4 and m["loss"] == "cwsa"
  assert np.isfinite(m["history"][0]["train_loss"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dataset", "svhn", "--out", "X"], "invalid choice: 'svhn'"),
        (["--dataset", "mnist", "--loss", "focal", "--out", "X"], "invalid choice: 'focal'"),
        (["--dataset", "mnist", "--out", "X", "--data-dir", "/nonexistent/dir"], "/nonexistent/dir"),
        (["--dataset", "mnist", "--out", "X", "--cwsa-tau", "1.5"], "tau must lie in"),
    ],
)
def test_cli_errors_are_one_line(args, message, tmp_path, capsys):
  args = [str(tmp_path / a) if a == "X" else a for a in args]
  with pytest.raises(SystemExit) if "invalid choice" in message else _nullcontext():
    code = cli.main(["train", *args])
    assert code == 2
  err = capsys.readouterr().err
  assert message in err
  assert "Traceback" not in err


def test_existing_output_directory_is_not_overwritten(tiny_mnist, tmp_path, capsys):
  out = tmp_path / "d"
  out.mkdir()
  (out / "keep.txt").write_text("earlier result")
  code = cli.main(["train", "--dataset", "mnist", "--data-dir", str(tiny_mnist), "--out", str(out)])
  assert code == 2
  assert "not empty" in capsys.readouterr().err
  assert (out / "keep.txt").read_text() == "earlier result"
  code = cli.main(["train", "--dataset", "mnist", "--data-dir", str(tiny_mnist), "--out", str(out),
                   "--resume"])
  assert code == 2
  assert "no checkpoint" in capsys.readouterr().err


class _nullcontext:
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False


def test_cwsa_temperature_schedule_is_geometric_from_start_to_end():
  import dataclasses as dc

  import jax.numpy as jnp

  from cwsa_jax.training.configs import get_config
  from cwsa_jax.training.train import cwsa_temperature

  const = dc.replace(get_config("mnist"), loss="cwsa", cwsa_temperature=0.05)
  assert float(cwsa_temperature(const, jnp.uint32(7), 100)) == pytest.approx(0.05)
  sched = dc.replace(const, cwsa_temperature_start=0.5)
  values = [float(cwsa_temperature(sched, jnp.uint32(s), 100)) for s in (0, 50, 100, 150)]
  assert values[0] == pytest.approx(0.5, rel=1e-6)
  assert values[1] == pytest.approx((0.5 * 0.05) ** 0.5, rel=1e-5)  # geometric midpoint
  assert values[2] == pytest.approx(0.05, rel=1e-5) and values[3] == pytest.approx(0.05, rel=1e-5)
  with pytest.raises(ValueError, match="temperature start"):
    dc.replace(sched, cwsa_temperature_start=0.0).validate()


def test_summarize_groups_by_schedule_and_writes_commands(tmp_path):
  from cwsa_jax.training import summarize

  def fake_run(name, seed, epochs, loss="ce", acc=0.8, **extra):
    d = tmp_path / name
    d.mkdir()
    metrics = {"dataset": "cifar10", "loss": loss, "seed": seed, "epochs": epochs,
               "test_accuracy": acc, "ece": 0.02, "aurc": 0.05, "eaurc": 0.03, "augrc": 0.04,
               "cwsa": {"0.5": 0.6, "0.9": 0.7}, "cwsa_plus": {"0.5": 0.65, "0.9": 0.75},
               "wall_seconds": 10.0, "data_source": "test", "device": "cpu"}
    config = {"dataset": "cifar10", "loss": loss, "seed": seed, "epochs": epochs, "batch_size": 128,
              "optimizer": "sgd", "learning_rate": 0.1, "weight_decay": 5e-4, "augment": True,
              "cwsa_weight": 0.5, "cwsa_tau": 0.5, "cwsa_temperature": 0.05, "cwsa_band": None,
              "cwsa_correctness": "probability", "max_steps": None, **extra}
    (d / "metrics.json").write_text(json.dumps(metrics))
    (d / "config.json").write_text(json.dumps(config))
    return str(d)

  runs = [fake_run("a", 0, 8, acc=0.78), fake_run("b", 1, 8, acc=0.80), fake_run("c", 0, 15, acc=0.83),
          fake_run("d", 0, 8, loss="cwsa", cwsa_temperature_start=0.5)]
  notes = tmp_path / "notes.md"
  notes.write_text("## Notes\nhello\n")
  out = tmp_path / "out"
  assert summarize.main(runs + ["--out", str(out), "--notes", str(notes)]) == 0
  summary = json.loads((out / "summary.json").read_text())
  assert len(summary["runs"]) == 4
  groups = {g["variant"]: g for g in summary["groups"]}
  assert set(groups) == {"8 ep, ce", "15 ep, ce", "8 ep, cwsa w=0.5 tau=0.5 T=0.05 T0=0.5"}
  assert groups["8 ep, ce"]["test_accuracy"][0] == pytest.approx(0.79)
  assert groups["8 ep, ce"]["seeds"] == [0, 1]
  readme = (out / "README.md").read_text()
  assert "--cwsa-temperature-start 0.5" in readme and readme.rstrip().endswith("hello")
