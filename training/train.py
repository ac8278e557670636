"""Training and evaluation loop for the MNIST and CIFAR-10 CNNs (Flax NNX + optax).

``train_and_evaluate(config, workdir, dataset)`` trains with plain
cross-entropy or the CWSA-regularized loss, checkpoints atomically after every
epoch, resumes from the last checkpoint, and finishes by evaluating the test
split with the hard metrics (CWSA/CWSA+ sweep, ECE, AURC, E-AURC, AUGRC).

Metrics accumulate in ``nnx.MultiMetric`` objects updated inside the jitted
steps, as in the flax MNIST example: the training loss and accuracy of each
epoch (``nnx.metrics.Average``, ``Accuracy``), and on the test split
:class:`~cwsa_jax.nnx.SweepMetric` and :class:`~cwsa_jax.nnx.CalibrationMetric`,
batch by batch, whose exact sums give the same sweep and ECE as one pass over
all the predictions. AURC, E-AURC and AUGRC need every confidence in order and
are computed once from the predictions.

Determinism: the data order of epoch e is a permutation seeded by (seed, e),
augmentation keys are ``fold_in(key(seed), step)`` and the dropout stream is
part of the checkpointed model state, so a run killed and resumed from its
last checkpoint follows exactly the same steps as an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from flax import serialization

import cwsa_jax as cw
from cwsa_jax import losses as cwsa_losses
from cwsa_jax.nnx import CalibrationMetric, SweepMetric
from . import data as data_lib
from . import models
from .configs import TrainConfig

CHECKPOINT = "checkpoint.msgpack"
CHECKPOINT_META = "checkpoint.json"
AT_THRESHOLDS = (0.5, 0.9)  # the thresholds metrics.json reports one by one
ECE_BINS = 15


# --------------------------------------------------------------------------- model and optimizer


def create_model(config: TrainConfig, num_classes: int) -> nnx.Module:
  rngs = nnx.Rngs(params=config.seed, dropout=config.seed + 1)
  sizes = {k: tuple(v) for k, v in (("widths", config.widths),
                                    ("convs_per_block", config.convs_per_block)) if v is not None}
  if config.model == "mnist_cnn":
    return models.MnistCNN(num_classes=num_classes, rngs=rngs, **sizes)
  if config.model == "cifar10_cnn":
    return models.Cifar10CNN(num_classes=num_classes, rngs=rngs, **sizes)
  raise ValueError(f"unknown model {config.model!r}; valid models: mnist_cnn, cifar10_cnn")


def learning_rate_schedule(config: TrainConfig, steps_per_epoch: int) -> optax.Schedule:
  """Linear warmup, then cosine decay to 0 over the remaining steps."""
  total = config.epochs * steps_per_epoch
  warmup = min(int(config.warmup_epochs * steps_per_epoch), total - 1)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=config.learning_rate, warmup_steps=max(warmup, 1),
      decay_steps=max(total, warmup + 1), end_value=0.0)


def create_optimizer(config: TrainConfig, model: nnx.Module, steps_per_epoch: int) -> nnx.Optimizer:
  schedule = learning_rate_schedule(config, steps_per_epoch)
  if config.optimizer == "adam":
    tx = optax.adamw(schedule, weight_decay=config.weight_decay) if config.weight_decay else optax.adam(schedule)
  else:
    tx = optax.chain(optax.add_decayed_weights(config.weight_decay),
                     optax.sgd(schedule, momentum=0.9, nesterov=True))
  return nnx.Optimizer(model, tx, wrt=nnx.Param)


# --------------------------------------------------------------------------- steps


def cwsa_temperature(config: TrainConfig, step: jax.Array, total_steps: int) -> jax.Array:
  """The sigmoid-gate temperature at ``step``: constant, or annealed geometrically
  ``T0 (T1/T0)^(step/total_steps)`` when ``cwsa_temperature_start`` (T0) is set."""
  end = jnp.float32(config.cwsa_temperature)
  if config.cwsa_temperature_start is None:
    return end
  start = jnp.float32(config.cwsa_temperature_start)
  frac = jnp.clip(step.astype(jnp.float32) / max(total_steps, 1), 0.0, 1.0)
  return start * (end / start) ** frac


def loss_fn(model: nnx.Module, images: jax.Array, labels: jax.Array, config: TrainConfig,
            temperature: jax.Array | float | None = None):
  """Returns (loss, logits): cross-entropy, or CE + w (1 - soft CWSA) for loss='cwsa'."""
  logits = model(images)
  if config.loss == "cwsa":
    loss = cwsa_losses.cwsa_regularized_loss(
        logits, labels, weight=config.cwsa_weight, tau=config.cwsa_tau,
        temperature=config.cwsa_temperature if temperature is None else temperature,
        band=config.cwsa_band, correctness=config.cwsa_correctness)
  else:
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
  return loss, logits


def _preprocess(images: jax.Array, config: TrainConfig, key: jax.Array | None) -> jax.Array:
  if key is not None and config.augment:
    images = data_lib.augment(key, images)
  return data_lib.normalize(images, dataset=config.dataset)


def make_train_metrics() -> nnx.MultiMetric:
  """The training loss and accuracy of an epoch, accumulated on the device by ``train_step``."""
  return nnx.MultiMetric(loss=nnx.metrics.Average("loss"), accuracy=nnx.metrics.Accuracy())


def make_train_step(config: TrainConfig, total_steps: int = 1) -> Callable:
  """``train_step(model, optimizer, metrics, images, labels, key) -> loss``, updating all three in place."""
  @nnx.jit
  def train_step(model, optimizer, metrics, images, labels, key):
    x = _preprocess(images, config, key)
    temperature = cwsa_temperature(config, optimizer.step[...], total_steps)
    grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
    (loss, logits), grads = grad_fn(model, x, labels, config, temperature)
    optimizer.update(model, grads)
    metrics.update(loss=loss, logits=logits, labels=labels)
    return loss

  return train_step


def make_predict(config: TrainConfig) -> Callable:
  @nnx.jit
  def predict(model, images):
    return jax.nn.softmax(model(_preprocess(images, config, None)).astype(jnp.float32), axis=-1)

  return predict


def make_evaluation_metrics(thresholds) -> nnx.MultiMetric:
  """The test-split metrics, updated batch by batch with ``confidences=`` and ``correct=``."""
  return nnx.MultiMetric(accuracy=nnx.metrics.Average("correct"), sweep=SweepMetric(thresholds),
                         at_threshold=SweepMetric(AT_THRESHOLDS),
                         calibration=CalibrationMetric(ECE_BINS))


@nnx.jit
def _update_evaluation(metrics: nnx.MultiMetric, probs: jax.Array, labels: jax.Array) -> None:
  confidences, correct = cw.confidences_from_probs(probs, labels)
  metrics.update(confidences=confidences, correct=correct)


def predict_probs(model: nnx.Module, images: np.ndarray, config: TrainConfig, *,
                  labels: np.ndarray | None = None,
                  metrics: nnx.MultiMetric | None = None) -> np.ndarray:
  """Class probabilities [N, K] in eval mode (batch-norm running stats, no dropout).

  With ``labels`` and ``metrics`` (:func:`make_evaluation_metrics`), also adds
  every batch's (max probability, argmax == label) to ``metrics``.
  """
  model.eval()
  predict = make_predict(config)
  out = []
  for i in range(0, len(images), config.eval_batch_size):
    probs = predict(model, jnp.asarray(images[i:i + config.eval_batch_size]))
    if metrics is not None:
      _update_evaluation(metrics, probs, jnp.asarray(labels[i:i + config.eval_batch_size]))
    out.append(np.asarray(probs))
  model.train()
  return np.concatenate(out)


# --------------------------------------------------------------------------- checkpoints


def _to_storable(tree):
  return jax.tree.map(
      lambda x: np.asarray(jax.random.key_data(x)) if jnp.issubdtype(getattr(x, "dtype", None) or np.float32, jax.dtypes.prng_key)
      else np.asarray(x), tree)


def save_checkpoint(workdir: Path, model, optimizer, meta: dict[str, Any]) -> None:
  """Writes model + optimizer state and metadata atomically (temp file + rename)."""
  state = nnx.to_pure_dict(nnx.state((model, optimizer)))
  blob = serialization.msgpack_serialize(_to_storable(state))
  for name, payload in ((CHECKPOINT, blob), (CHECKPOINT_META, json.dumps(meta, indent=1).encode())):
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=workdir)
    with os.fdopen(fd, "wb") as f:
      f.write(payload)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, workdir / name)


def restore_checkpoint(workdir: Path, model, optimizer) -> dict[str, Any]:
  """Loads the checkpoint into ``model`` and ``optimizer``; returns its metadata."""
  meta = json.loads((workdir / CHECKPOINT_META).read_text())
  stored = serialization.msgpack_restore((workdir / CHECKPOINT).read_bytes())
  state = nnx.state((model, optimizer))
  template = nnx.to_pure_dict(state)

  def restore_leaf(like, value):
    if jnp.issubdtype(like.dtype, jax.dtypes.prng_key):
      return jax.random.wrap_key_data(jnp.asarray(value), impl=jax.random.key_impl(like))
    return jnp.asarray(value, dtype=like.dtype)

  restored = jax.tree.map(restore_leaf, template, stored)
  nnx.replace_by_pure_dict(state, restored)
  nnx.update((model, optimizer), state)
  return meta


# --------------------------------------------------------------------------- progress


class Progress:
  """A one-line progress bar with loss, accuracy and ETA (tqdm, of the ``[train]`` extra; none without)."""

  def __init__(self, total: int, desc: str, enabled: bool = True):
    self.enabled = enabled
    self.bar = None
    if enabled:
      try:
        from tqdm.auto import tqdm
        self.bar = tqdm(total=total, desc=desc, unit="step", file=sys.stderr, dynamic_ncols=True,
                        mininterval=1.0)
      except ImportError:  # tqdm is optional: no progress bar
        self.bar = None
    self.total, self.done, self.start, self.desc = total, 0, time.time(), desc

  def update(self, n: int, **postfix) -> None:
    self.done += n
    if not self.enabled:
      return
    if self.bar is not None:
      self.bar.set_postfix({k: f"{v:.4f}" for k, v in postfix.items()}, refresh=False)
      self.bar.update(n)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


# --------------------------------------------------------------------------- evaluation


def evaluate_predictions(probs: np.ndarray, labels: np.ndarray,
                         computed: dict[str, Any]) -> dict[str, Any]:
  """Hard-metric summary of test predictions (the metrics.json body).

  ``computed`` is ``make_evaluation_metrics(...).compute()`` after every test batch;
  AURC, E-AURC and AUGRC (exact, sort-based) come from ``probs`` and ``labels``.
  """
  conf, correct = cw.confidences_from_probs(probs, labels)
  r, at_r = computed["sweep"], computed["at_threshold"]
  at = {str(tau): {field: float(getattr(at_r, field)[j])
                   for field in ("cwsa", "cwsa_plus", "coverage", "selective_accuracy")}
        for j, tau in enumerate(AT_THRESHOLDS)}
  as_list = lambda x: [None if not np.isfinite(v) else float(v) for v in np.asarray(x)]
  return {
      "n": int(len(labels)),
      "test_accuracy": float(computed["accuracy"]),
      "ece": float(computed["calibration"]),
      "aurc": float(cw.aurc(conf, correct)),
      "eaurc": float(cw.eaurc(conf, correct)),
      "augrc": float(cw.augrc(conf, correct)),
      "cwsa": {k: v["cwsa"] for k, v in at.items()},
      "cwsa_plus": {k: v["cwsa_plus"] for k, v in at.items()},
      "at_threshold": at,
      "sweep": {"thresholds": as_list(r.thresholds), "coverage": as_list(r.coverage),
                "selective_accuracy": as_list(r.selective_accuracy), "cwsa": as_list(r.cwsa),
                "cwsa_plus": as_list(r.cwsa_plus)},
  }


# --------------------------------------------------------------------------- the loop


def train_and_evaluate(config: TrainConfig, workdir: str | os.PathLike, dataset: data_lib.Dataset, *,
                       max_steps: int | None = None, resume: bool = False, progress: bool = True,
                       _crash_at_step: int | None = None) -> dict[str, Any]:
  """Trains, checkpoints every epoch, evaluates on the test split; returns metrics.

  Writes into ``workdir``: ``checkpoint.msgpack`` / ``checkpoint.json`` (after
  every epoch), ``predictions.npz`` (``probs`` [N, K], ``labels`` [N]),
  ``metrics.json`` and ``config.json``.

  Args:
    config: the run's :class:`TrainConfig`.
    workdir: output folder (created).
    dataset: a :class:`cwsa_jax.training.data.Dataset`.
    max_steps: stop after this many optimizer steps in total (a short run).
    resume: continue from the checkpoint in ``workdir``.
    progress: show a progress bar.
  """
  config.validate()
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  start_time = time.time()
  steps_per_epoch = data_lib.num_batches(len(dataset.train_labels), batch_size=config.batch_size,
                                         drop_remainder=True)
  if steps_per_epoch < 1:
    raise ValueError(f"the training split ({len(dataset.train_labels)} examples) is smaller than "
                     f"one batch ({config.batch_size})")
  model = create_model(config, dataset.num_classes)
  optimizer = create_optimizer(config, model, steps_per_epoch)
  start_epoch, step, elapsed_before = 0, 0, 0.0
  if resume and (workdir / CHECKPOINT_META).exists():
    meta = restore_checkpoint(workdir, model, optimizer)
    start_epoch, step, elapsed_before = meta["epoch"], meta["step"], meta.get("wall_seconds", 0.0)
    history = list(meta.get("history", []))
    print(f"resumed from {workdir / CHECKPOINT} (epoch {start_epoch}, step {step})", file=sys.stderr)
  else:
    history = []
  total_steps = config.epochs * steps_per_epoch
  if max_steps is not None:
    total_steps = min(total_steps, max_steps)
  (workdir / "config.json").write_text(json.dumps({**config.__dict__, "max_steps": max_steps}, indent=1))

  train_step = make_train_step(config, config.epochs * steps_per_epoch)
  train_metrics = make_train_metrics()
  base_key = jax.random.key(config.seed)
  bar = Progress(total_steps, f"{config.dataset}/{config.loss} seed {config.seed}", progress)
  bar.update(step)
  shown = step
  epoch = start_epoch
  while epoch < config.epochs and step < total_steps:
    # The metrics stay on the device; reading them every step would stall dispatch.
    train_metrics.reset()
    batches = data_lib.iterate_batches(dataset.train_images, dataset.train_labels,
                                       batch_size=config.batch_size, seed=config.seed, epoch=epoch,
                                       drop_remainder=True)
    for images, labels in batches:
      if step >= total_steps:
        break
      key = jax.random.fold_in(base_key, step)
      loss = train_step(model, optimizer, train_metrics, jnp.asarray(images), jnp.asarray(labels), key)
      step += 1
      if _crash_at_step is not None and step == _crash_at_step:
        jax.block_until_ready(loss)
        os._exit(17)  # tests: die like a killed process, without cleanup
      if step % 20 == 0 or step == total_steps:
        now = train_metrics.compute()
        bar.update(step - shown, loss=float(now["loss"]), acc=float(now["accuracy"]),
                   epoch=epoch + 1)
        shown = step
    if shown < step:
      bar.update(step - shown)
      shown = step
    epoch_metrics = train_metrics.compute()
    epoch += 1
    history.append({"epoch": epoch, "step": step, "train_loss": float(epoch_metrics["loss"]),
                    "train_accuracy": float(epoch_metrics["accuracy"])})
    save_checkpoint(workdir, model, optimizer, {
        "epoch": epoch, "step": step, "wall_seconds": elapsed_before + time.time() - start_time,
        "history": history})
  bar.close()

  labels = np.asarray(dataset.test_labels)
  test_metrics = make_evaluation_metrics(config.thresholds)
  probs = predict_probs(model, dataset.test_images, config, labels=labels, metrics=test_metrics)
  tmp = workdir / ".predictions.tmp.npz"
  np.savez_compressed(tmp, probs=probs.astype(np.float32), labels=labels)
  os.replace(tmp, workdir / "predictions.npz")
  metrics = evaluate_predictions(probs, labels, test_metrics.compute())
  metrics.update({
      "dataset": config.dataset, "loss": config.loss, "seed": config.seed, "epochs": epoch,
      "steps": step, "wall_seconds": elapsed_before + time.time() - start_time,
      "data_source": dataset.source, "device": str(jax.devices()[0].device_kind),
      "history": history})
  from cwsa_jax._cli_util import write_json_atomic
  write_json_atomic(workdir / "metrics.json", metrics)
  return metrics
