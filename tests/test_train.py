"""Training loop: a tiny end-to-end run, checkpoints, kill + resume equality, CLI errors; the
validation split, temperature scaling and threshold selection, the losses, the device-side batches."""

import gzip
import json
import os
import re
import struct
import subprocess
import sys

import numpy as np
import pytest

from cwsa_jax import cli

TRAIN, TEST = 192, 64
# At the default --val-fraction 0.1, the stratified split of the tiny set below holds out
# VALIDATION of the TRAIN examples: 5 steps per epoch at batch 32.
VALIDATION = 18


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


_SUBPROCESS_ENV: dict[str, str] = {}


@pytest.fixture(scope="module", autouse=True)
def _shared_compilation_cache(tmp_path_factory):
  """The `cwsa-jax train` subprocesses share compiled executables (JAX's persistent cache):
  the same programs, so the same results, compiled once instead of once per run.

  Only the subprocesses get the cache, through their environment; the pytest
  worker's own environment is left as it was.
  """
  _SUBPROCESS_ENV.update(JAX_COMPILATION_CACHE_DIR=str(tmp_path_factory.mktemp("jax-cache")),
                         JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                         JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  yield
  _SUBPROCESS_ENV.clear()


def _train(args, env_extra=None, check=True, kill_at_step=None):
  env = {**os.environ, **_SUBPROCESS_ENV, "CWSA_JAX_CACHE": str(env_extra or ""),
         "PYTHONHASHSEED": "0"}
  command = [sys.executable, "-m", "cwsa_jax.cli", "train"]
  if kill_at_step is not None:
    command = [sys.executable, "-c", _KILLED_AT_STEP, str(kill_at_step)]
  return subprocess.run(command + list(args), capture_output=True, text=True, env=env, check=False)


def _common(data, out, cache):
  return ["--dataset", "mnist", "--data-dir", str(data), "--out", str(out), "--epochs", "2",
          "--batch-size", "32", "--seed", "3", "--no-progress"]


@pytest.mark.slow  # a training run killed and resumed in subprocesses
def test_killed_run_resumes_to_identical_results(tiny_mnist, tmp_path):
  cache = tmp_path / "cache"
  straight = _train(_common(tiny_mnist, tmp_path / "a", cache), cache)
  assert straight.returncode == 0, straight.stderr
  # 5 steps per epoch: die at step 8, after the epoch-1 checkpoint, mid epoch 2.
  killed = _train(_common(tiny_mnist, tmp_path / "b", cache), cache, kill_at_step=8)
  assert killed.returncode == 17
  assert json.loads((tmp_path / "b" / "checkpoint.json").read_text())["step"] == 5
  assert not (tmp_path / "b" / "metrics.json").exists()
  resumed = _train(_common(tiny_mnist, tmp_path / "b", cache) + ["--resume"], cache)
  assert resumed.returncode == 0, resumed.stderr
  a = json.loads((tmp_path / "a" / "metrics.json").read_text())
  b = json.loads((tmp_path / "b" / "metrics.json").read_text())
  for key in ("test_accuracy", "ece", "aurc", "eaurc", "augrc", "cwsa", "cwsa_plus", "sweep", "history",
              "nll", "temperature", "temperature_scaled", "validation", "selected_threshold",
              "scores", "scores_temperature_scaled", "split"):
    assert a[key] == b[key], key
  pa, pb = np.load(tmp_path / "a" / "predictions.npz"), np.load(tmp_path / "b" / "predictions.npz")
  for key in ("probs", "labels", "logits", "temperature", "validation_logits", "validation_labels"):
    np.testing.assert_array_equal(pa[key], pb[key])
  # The run learned something (the bars make the task easy) and metrics.json is complete.
  assert a["test_accuracy"] > 0.3
  assert a["steps"] == 10 and a["epochs"] == 2 and a["n"] == TEST
  assert a["split"] == {"train": TRAIN - VALIDATION, "validation": VALIDATION, "val_fraction": 0.1,
                        "stratified": True}
  assert a["validation"]["n"] == VALIDATION and pa["validation_logits"].shape == (VALIDATION, 10)
  # The temperature is fitted on the validation logits and scales the test logits.
  import cwsa_jax as cw
  assert a["temperature"] == pytest.approx(
      float(cw.fit_temperature(pa["validation_logits"], pa["validation_labels"])), rel=1e-6)
  assert float(pa["temperature"]) == pytest.approx(a["temperature"], rel=1e-6)
  assert a["nll"] == pytest.approx(float(cw.nll(pa["logits"], pa["labels"], from_logits=True)), abs=1e-5)
  assert a["temperature_scaled"]["nll"] == pytest.approx(
      float(cw.nll(pa["logits"] / a["temperature"], pa["labels"], from_logits=True)), abs=1e-4)
  assert a["temperature_scaled"]["test_accuracy"] == a["test_accuracy"]  # argmax unchanged
  # The threshold is a grid value chosen on validation; its test operating point is reported.
  chosen = a["selected_threshold"]
  assert chosen["metric"] == "cwsa" and chosen["score"] == "msp"
  assert any(chosen["threshold"] == pytest.approx(t) for t in np.arange(0.5, 1.0, 0.01))
  assert set(chosen["validation"]) == {"coverage", "selective_risk", "cwsa"}
  assert set(chosen["test"]) == {"coverage", "selective_risk", "cwsa", "cwsa_plus"}
  assert set(a["scores"]) == {"msp", "max_logit", "margin", "neg_entropy", "doctor"}
  assert a["scores"]["max_logit"]["cwsa"] is None
  assert set(a["cwsa"]) == {"0.5", "0.9"} and len(a["sweep"]["cwsa"]) == 50
  assert "idx" in a["data_source"]


@pytest.mark.slow  # a whole train command in a subprocess
def test_cwsa_loss_and_max_steps(tiny_mnist, tmp_path):
  out = tmp_path / "c"
  r = _train(_common(tiny_mnist, out, tmp_path / "cache") +
             ["--loss", "cwsa", "--max-steps", "4", "--cwsa-weight", "1.0", "--cwsa-tau", "0.6",
              "--threshold-metric", "selective_accuracy"],
             tmp_path / "cache")
  assert r.returncode == 0, r.stderr
  m = json.loads((out / "metrics.json").read_text())
  assert m["steps"] == 4 and m["loss"] == "cwsa"
  assert np.isfinite(m["history"][0]["train_loss"])
  config = json.loads((out / "config.json").read_text())
  assert (config["cwsa_weight"], config["cwsa_tau"]) == (1.0, 0.6)
  # Data parallel by default: on a CPU one device per core (here at most 32, the batch size).
  assert m["devices"] == config["devices"] >= 1
  assert m["selected_threshold"]["metric"] == "selective_accuracy"
  assert (m["split"]["train"], m["split"]["validation"]) == (TRAIN - VALIDATION, VALIDATION)


def test_flags_set_the_config():
  from cwsa_jax.cli import build_parser
  from cwsa_jax.training._cmd_train import config_from_args

  args = build_parser().parse_args([
      "train", "--dataset", "cifar10", "--out", "X", "--loss", "soft_aurc", "--label-smoothing", "0.1",
      "--soft-aurc-weight", "2", "--soft-aurc-temperature", "0.02", "--focal-gamma", "1.5",
      "--val-fraction", "0.2", "--threshold-metric", "cwsa_plus", "--threshold-min-coverage", "0.8",
      "--threshold-max-risk", "0.05", "--lr", "0.05", "--cwsa-band", "0.5", "0.9", "--seed", "4"])
  config = config_from_args(args)
  assert (config.loss, config.label_smoothing, config.soft_aurc_weight, config.soft_aurc_temperature,
          config.focal_gamma, config.val_fraction, config.threshold_metric,
          config.threshold_min_coverage, config.threshold_max_risk, config.learning_rate,
          config.cwsa_band, config.seed) == ("soft_aurc", 0.1, 2.0, 0.02, 1.5, 0.2, "cwsa_plus", 0.8,
                                             0.05, 0.05, (0.5, 0.9), 4)
  defaults = config_from_args(build_parser().parse_args(["train", "--dataset", "mnist", "--out", "X"]))
  assert (defaults.val_fraction, defaults.label_smoothing, defaults.threshold_metric) == (0.1, 0.0, "cwsa")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dataset", "svhn", "--out", "X"], "invalid choice: 'svhn'"),
        (["--dataset", "mnist", "--loss", "hinge", "--out", "X"], "invalid choice: 'hinge'"),
        (["--dataset", "mnist", "--out", "X", "--data-dir", "/nonexistent/dir"], "/nonexistent/dir"),
        (["--dataset", "mnist", "--out", "X", "--cwsa-tau", "1.5"], "tau must lie in"),
        (["--dataset", "mnist", "--out", "X", "--loss", "focal", "--focal-gamma", "-1"],
         "focal gamma must be >= 0, got -1.0"),
        (["--dataset", "mnist", "--out", "X", "--soft-aurc-temperature", "0"],
         "soft AURC temperature must be > 0, got 0.0"),
        (["--dataset", "mnist", "--out", "X", "--cwsa-temperature", "-0.1"],
         "cwsa temperature must be > 0"),
        (["--dataset", "mnist", "--out", "X", "--val-fraction", "0"], "must lie in (0, 0.5], got 0.0"),
        (["--dataset", "mnist", "--out", "X", "--val-fraction", "0.6"], "must lie in (0, 0.5], got 0.6"),
        (["--dataset", "mnist", "--out", "X", "--val-fraction", "nan"], "must lie in (0, 0.5], got nan"),
        (["--dataset", "mnist", "--out", "X", "--loss", "focal", "--label-smoothing", "0.1"],
         "label smoothing applies to the cross-entropy term"),
        (["--dataset", "mnist", "--out", "X", "--threshold-max-risk", "2"],
         "threshold max risk must lie in [0, 1]"),
        (["--dataset", "mnist", "--out", "X", "--threshold-metric", "f1"], "invalid choice: 'f1'"),
        (["--dataset", "mnist", "--out", "X", "--devices", "3"],
         "the batch size 128 does not split evenly over 3 devices"),
        (["--dataset", "mnist", "--out", "X", "--devices", "0"],
         "the device count must be an integer >= 1, got 0"),
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


def test_too_small_validation_split_is_one_error(tiny_mnist, tmp_path, capsys):
  out = tmp_path / "e"
  code = cli.main(["train", "--dataset", "mnist", "--data-dir", str(tiny_mnist), "--out", str(out),
                   "--val-fraction", "0.01"])
  assert code == 2
  err = capsys.readouterr().err
  assert "fewer than the 10 classes" in err and "Traceback" not in err
  assert not out.exists()


# --------------------------------------------------------------------------- the pieces, in-process


def _small_config(**overrides):
  """A CIFAR-10 config with a tiny CNN (cheap to compile), augmentation on."""
  import dataclasses as dc

  from cwsa_jax.training.configs import get_config
  return dc.replace(get_config("cifar10"), widths=(4, 4, 4), convs_per_block=(1, 1, 1),
                    batch_size=8, epochs=2, **overrides)


def test_device_batches_equal_host_batches():
  import jax

  from cwsa_jax.training import data

  rng = np.random.default_rng(1)
  images = rng.integers(0, 256, (45, 4, 4, 3)).astype(np.uint8)
  labels = rng.integers(0, 10, 45).astype(np.int32)
  gather = jax.jit(data.gather_batch, static_argnames="batch_size")
  for epoch in (0, 1):
    order = data.epoch_permutation(45, seed=5, epoch=epoch).astype(np.int32)
    host = list(data.iterate_batches(images, labels, batch_size=8, seed=5, epoch=epoch,
                                     drop_remainder=True))
    assert len(host) == 5
    for b, (x, y) in enumerate(host):
      dx, dy = gather(images, labels, order, np.int32(b), batch_size=8)
      np.testing.assert_array_equal(np.asarray(dx), x)
      np.testing.assert_array_equal(np.asarray(dy), y)


@pytest.mark.xla_defaults
def test_train_step_equals_host_fed_steps():
  """The device-side pipeline takes the steps a host-fed loop takes, bit for bit: same batches,
  augmentation keys, dropout, temperature schedule and updates."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from cwsa_jax.training import data, train

  config = _small_config(loss="cwsa", cwsa_temperature_start=0.5)
  rng = np.random.default_rng(2)
  images = rng.integers(0, 256, (40, 32, 32, 3)).astype(np.uint8)
  labels = rng.integers(0, 10, 40).astype(np.int32)
  steps_per_epoch, total = 5, 10

  def fresh():
    model = train.create_model(config, 10)
    return model, train.create_optimizer(config, model, steps_per_epoch), train.make_train_metrics()

  # The host-fed loop: numpy batches, keys folded in on the host, nnx.jit updating in place.
  @nnx.jit
  def host_step(model, optimizer, metrics, x, y, key):
    x = train._preprocess(x, config, key)
    temperature = train.cwsa_temperature(config, optimizer.step[...], total)
    (loss, logits), grads = nnx.value_and_grad(train.loss_fn, has_aux=True)(
        model, x, y, config, temperature)
    optimizer.update(model, grads)
    metrics.update(loss=loss, logits=logits, labels=y)
    return loss

  model, optimizer, metrics = fresh()
  host_losses, step = [], 0
  for epoch in range(2):
    for x, y in data.iterate_batches(images, labels, batch_size=8, seed=config.seed, epoch=epoch,
                                     drop_remainder=True):
      key = jax.random.fold_in(jax.random.key(config.seed), step)
      host_losses.append(float(host_step(model, optimizer, metrics, jnp.asarray(x), jnp.asarray(y), key)))
      step += 1
  host_params = jax.tree.leaves(nnx.state(model, nnx.Param))

  objects = fresh()
  graphdef, state = nnx.split(objects)
  train_step = train.make_train_step(config, graphdef, total)
  device_images, device_labels = jax.device_put(images), jax.device_put(labels)
  device_losses = []
  for epoch in range(2):
    order = jax.device_put(data.epoch_permutation(40, seed=config.seed, epoch=epoch).astype(np.int32))
    for b in range(steps_per_epoch):
      state, loss = train_step(state, device_images, device_labels, order, np.int32(b))
      device_losses.append(float(loss))
  nnx.update(objects, state)
  assert device_losses == host_losses
  for a, b in zip(host_params, jax.tree.leaves(nnx.state(objects[0], nnx.Param))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert float(objects[2].compute()["loss"]) == float(metrics.compute()["loss"])


def test_loss_fn_dispatches_to_the_library_losses():
  import dataclasses as dc

  import jax
  import optax

  from cwsa_jax import losses
  from cwsa_jax.training import train
  from cwsa_jax.training.configs import LOSSES

  rng = np.random.default_rng(3)
  logits = rng.normal(size=(16, 10)).astype(np.float32) * 2
  labels = rng.integers(0, 10, 16).astype(np.int32)
  model = lambda images: logits  # loss_fn calls model(images)
  base = _small_config()

  def loss(name, **overrides):
    value, out_logits = train.loss_fn(model, None, labels, dc.replace(base, loss=name, **overrides))
    assert out_logits is logits
    return float(value)

  assert set(LOSSES) == {"ce", "cwsa", "focal", "inverse_focal", "soft_aurc"}
  ce = float(optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean())
  assert loss("ce") == ce
  assert loss("cwsa", cwsa_weight=0.3) == float(losses.cwsa_regularized_loss(
      logits, labels, weight=0.3, tau=base.cwsa_tau, temperature=base.cwsa_temperature))
  assert loss("focal", focal_gamma=2.0) == float(losses.focal_loss(logits, labels, gamma=2.0))
  assert loss("inverse_focal", focal_gamma=2.0) == float(
      losses.inverse_focal_loss(logits, labels, gamma=2.0))
  assert loss("focal", focal_gamma=0.0) == pytest.approx(ce, rel=1e-6)
  assert loss("soft_aurc", soft_aurc_weight=2.0, soft_aurc_temperature=0.05) == float(
      losses.soft_aurc_regularized_loss(logits, labels, weight=2.0, temperature=0.05))
  # Label smoothing: CE against (1 - a) one_hot + a / K, by hand; added to the regularizers.
  alpha = 0.2
  log_probs = np.asarray(jax.nn.log_softmax(logits))
  targets = (1 - alpha) * np.eye(10)[labels] + alpha / 10
  smoothed = float(-(targets * log_probs).sum(-1).mean())
  assert loss("ce", label_smoothing=alpha) == pytest.approx(smoothed, rel=1e-5)
  assert loss("soft_aurc", label_smoothing=alpha) == pytest.approx(
      smoothed + float(losses.soft_aurc_loss(logits, labels, temperature=0.01)), rel=1e-5)
  assert loss("cwsa", label_smoothing=alpha) == pytest.approx(
      smoothed + base.cwsa_weight * float(losses.cwsa_surrogate_loss(logits, labels)), rel=1e-5)


def test_validation_split_is_stratified_seeded_and_disjoint():
  from cwsa_jax.training.train import validation_split

  labels = np.repeat(np.arange(4), [40, 20, 10, 30])
  np.random.default_rng(0).shuffle(labels)
  train_idx, val_idx = validation_split(labels, fraction=0.1, seed=7, num_classes=4)
  assert np.bincount(labels[val_idx], minlength=4).tolist() == [4, 2, 1, 3]
  assert sorted(np.concatenate([train_idx, val_idx]).tolist()) == list(range(100))
  assert np.all(np.diff(train_idx) > 0) and np.all(np.diff(val_idx) > 0)
  again = validation_split(labels, fraction=0.1, seed=7, num_classes=4)[1]
  other = validation_split(labels, fraction=0.1, seed=8, num_classes=4)[1]
  np.testing.assert_array_equal(again, val_idx)
  assert not np.array_equal(other, val_idx)
  for fraction in (0.0, 0.51, float("nan"), -0.1):
    with pytest.raises(ValueError, match="validation fraction"):
      validation_split(labels, fraction=fraction, seed=0, num_classes=4)
  with pytest.raises(ValueError, match="fewer than the 4 classes"):
    validation_split(labels, fraction=0.02, seed=0, num_classes=4)


def test_scores_outside_the_unit_interval_keep_their_rank_metrics():
  import cwsa_jax as cw
  from cwsa_jax.training.train import score_metrics

  rng = np.random.default_rng(4)
  logits = rng.normal(size=(300, 5)).astype(np.float32) * 3
  logits[:20] = logits[20:40]  # tied scores
  labels = rng.integers(0, 5, 300)
  correct = np.argmax(logits, -1) == labels
  max_logit = np.asarray(cw.confidence_scores(logits, method="max_logit"))
  # The scores' dense ranks in [0, 1] (order and ties as the scores'): the same rank metrics.
  mapped = (np.unique(max_logit, return_inverse=True)[1].reshape(-1)
            / (np.unique(max_logit).size - 1)).astype(np.float32)
  msp = np.asarray(cw.confidence_scores(logits, method="msp"))
  summary = score_metrics(logits, labels)
  assert summary["msp"]["aurc"] == float(cw.aurc(msp, correct))
  assert summary["msp"]["cwsa"]["0.9"] == pytest.approx(float(cw.cwsa(msp, correct, 0.9)), abs=1e-6)
  for name in ("max_logit", "neg_entropy"):
    assert summary[name]["cwsa"] is None
  for metric in ("aurc", "eaurc", "augrc"):
    assert summary["max_logit"][metric] == float(getattr(cw, metric)(mapped, correct)), metric


def test_deployment_threshold_is_chosen_on_validation_and_applied_to_test():
  import dataclasses as dc

  import cwsa_jax as cw
  from cwsa_jax.training.train import select_deployment_threshold

  rng = np.random.default_rng(5)

  def split(n):
    logits = rng.normal(size=(n, 3)).astype(np.float32) * 2
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    return probs.astype(np.float32), rng.integers(0, 3, n)

  (vp, vy), (tp, ty) = split(200), split(300)
  config = _small_config()
  out = select_deployment_threshold(vp, vy, tp, ty, config)
  choice = cw.select_threshold(*cw.confidences_from_probs(vp, vy),
                               thresholds=np.asarray(config.thresholds, np.float32))
  assert out["threshold"] == choice.threshold
  assert out["validation"] == {"coverage": choice.coverage, "selective_risk": choice.selective_risk,
                               "cwsa": choice.value}
  conf, correct = cw.confidences_from_probs(tp, ty)
  tau = np.float32(choice.threshold)
  assert out["test"]["coverage"] == pytest.approx(float(cw.coverage(conf, tau)), abs=1e-7)
  assert out["test"]["selective_risk"] == pytest.approx(
      1 - float(cw.selective_accuracy(conf, correct, tau)), abs=1e-6)
  # No threshold meets the constraints: recorded, not raised.
  strict = dc.replace(config, threshold_min_coverage=1.0, threshold_max_risk=0.0)
  out = select_deployment_threshold(vp, vy, tp, ty, strict)
  assert out["threshold"] is None and "no threshold" in out["reason"] and out["test"] is None


@pytest.mark.parametrize("field, value, message", [
    ("loss", "hinge", "unknown loss 'hinge'"),
    ("focal_gamma", -0.5, "focal gamma must be >= 0"),
    ("focal_gamma", float("inf"), "focal gamma must be >= 0"),
    ("soft_aurc_temperature", 0.0, "soft AURC temperature must be > 0"),
    ("soft_aurc_weight", -1.0, "soft AURC weight must be >= 0"),
    ("cwsa_temperature", 0.0, "cwsa temperature must be > 0"),
    ("label_smoothing", 1.0, "label smoothing must lie in [0, 1)"),
    ("val_fraction", 0.0, "validation fraction must lie in (0, 0.5]"),
    ("val_fraction", 0.75, "validation fraction must lie in (0, 0.5]"),
    ("threshold_metric", "f1", "unknown threshold metric 'f1'"),
    ("threshold_min_coverage", 1.5, "threshold min coverage must lie in [0, 1]"),
    ("learning_rate", 0.0, "learning rate must be > 0"),
    ("seed", -1, "seed must be an integer >= 0"),
    ("cwsa_band", (0.9, 0.5), "cwsa band must be"),
    ("thresholds", (0.5, 1.0), "thresholds must be"),
])
def test_config_rejects_each_bad_field(field, value, message):
  import dataclasses as dc
  config = dc.replace(_small_config(), **{field: value})
  with pytest.raises(ValueError, match=re.escape(message)):
    config.validate()
  _small_config().validate()


def test_summarize_tables_per_score_and_threshold_for_runs_with_a_validation_split(tmp_path):
  from cwsa_jax.training import summarize

  def fake_run(name, seed, loss, acc, **extra):
    d = tmp_path / name
    d.mkdir()
    score = lambda aurc, cwsa: {"aurc": aurc, "eaurc": aurc / 2, "augrc": aurc / 3,
                                "cwsa": cwsa, "cwsa_plus": cwsa}
    at = {"0.5": 0.9, "0.9": 0.95}
    metrics = {"dataset": "mnist", "loss": loss, "seed": seed, "epochs": 5, "test_accuracy": acc,
               "ece": 0.01, "aurc": 0.001, "eaurc": 0.0005, "augrc": 0.0008, "cwsa": at,
               "cwsa_plus": at, "wall_seconds": 10.0, "data_source": "test", "device": "cpu",
               "nll": 0.05, "temperature": 1.5 + seed,
               "temperature_scaled": {"nll": 0.04, "ece": 0.005},
               "selected_threshold": {"threshold": 0.9, "validation": {"coverage": 0.97,
                                                                      "selective_risk": 0.001},
                                      "test": {"coverage": 0.96, "selective_risk": 0.002}},
               "scores": {"msp": score(0.001, at), "max_logit": score(0.002, None),
                          "margin": score(0.0011, at), "neg_entropy": score(0.0012, None),
                          "doctor": score(0.0013, at)}}
    config = {"dataset": "mnist", "loss": loss, "seed": seed, "epochs": 5, "batch_size": 128,
              "optimizer": "adam", "learning_rate": 0.002, "weight_decay": 0.0, "augment": False,
              "cwsa_weight": 0.5, "cwsa_tau": 0.5, "cwsa_temperature": 0.05, "cwsa_band": None,
              "cwsa_correctness": "probability", "cwsa_temperature_start": None,
              "label_smoothing": 0.0, "focal_gamma": 3.0, "soft_aurc_weight": 1.0,
              "soft_aurc_temperature": 0.01, "val_fraction": 0.1, "threshold_metric": "cwsa",
              "threshold_min_coverage": None, "threshold_max_risk": None, "max_steps": None, **extra}
    (d / "metrics.json").write_text(json.dumps(metrics))
    (d / "config.json").write_text(json.dumps(config))
    return str(d)

  runs = [fake_run("f0", 0, "focal", 0.99), fake_run("f1", 1, "focal", 0.98),
          fake_run("s0", 0, "soft_aurc", 0.99), fake_run("l0", 0, "ce", 0.99, label_smoothing=0.1)]
  out = tmp_path / "out"
  assert summarize.main(runs + ["--out", str(out)]) == 0
  groups = {g["variant"]: g for g in json.loads((out / "summary.json").read_text())["groups"]}
  assert set(groups) == {"5 ep, focal gamma=3.0, val 0.1", "5 ep, soft_aurc w=1.0 T=0.01, val 0.1",
                         "5 ep, ce ls=0.1, val 0.1"}
  focal = groups["5 ep, focal gamma=3.0, val 0.1"]
  assert focal["temperature"] == pytest.approx((2.0, 0.5))
  assert focal["scores"]["max_logit"]["aurc"][0] == pytest.approx(0.002)
  assert focal["scores"]["max_logit"]["cwsa:0.9"] is None
  readme = (out / "README.md").read_text()
  assert "## MNIST: losses and confidence scores" in readme
  assert "| 5 ep, focal gamma=3.0, val 0.1 | neg_entropy | 2 |" in readme
  assert "## Temperature scaling and the deployment threshold" in readme
  assert "--loss focal --epochs 5 --seed 1 --data-dir DATA --out runs/f1 --focal-gamma 3.0" in readme
  assert "--soft-aurc-weight 1.0 --soft-aurc-temperature 0.01 --val-fraction 0.1" in readme
  assert "--label-smoothing 0.1" in readme


def test_train_accuracy_metric_equals_nnx_accuracy():
  """The float32-correctness accuracy of the train step (one all-reduce fewer when data
  parallel) accumulates the same totals as ``nnx.metrics.Accuracy``, ties in the logits too."""
  import jax.numpy as jnp
  from flax import nnx
  from cwsa_jax.training import train
  rng = np.random.default_rng(4)
  ours, theirs = train.make_train_metrics(), nnx.metrics.Accuracy()
  for n in (64, 37):
    logits = jnp.asarray(rng.integers(0, 3, (n, 10)), jnp.float32)  # ties: argmax takes the first
    labels = jnp.asarray(rng.integers(0, 10, n), jnp.int32)
    ours.update(loss=jnp.float32(0.0), logits=logits, labels=labels)
    theirs.update(logits=logits, labels=labels)
  assert float(ours.compute()["accuracy"]) == float(theirs.compute())
  assert int(ours.accuracy.count[...]) == 101
