"""Training and evaluation loop for the MNIST and CIFAR-10 CNNs (Flax NNX + optax).

``train_and_evaluate(config, workdir, dataset)`` holds a stratified, seeded
validation split out of the training set (:func:`validation_split`), trains
on the rest with one of the losses of
:data:`~cwsa_jax.training.configs.LOSSES`, checkpoints atomically after
every epoch, resumes from the last checkpoint, and finishes
(:func:`~cwsa_jax.training._evaluation.evaluate_run`) by

1. evaluating the validation and test splits with the hard metrics
   (CWSA/CWSA+ sweep, ECE, NLL, AURC, E-AURC, AUGRC);
2. fitting the softmax temperature on the validation logits
   (:func:`cwsa_jax.fit_temperature`) and evaluating the test split again
   with the scaled logits;
3. choosing the deployment threshold on the temperature-scaled validation
   confidences (:func:`cwsa_jax.select_threshold`) and reporting its coverage
   and selective risk on the validation and the test split;
4. scoring the test predictions with each confidence score of
   :data:`SCORES`, before and after scaling (:func:`score_metrics`).

Metrics accumulate in ``nnx.MultiMetric`` objects updated inside the jitted
steps, as in the flax MNIST example: the training loss and accuracy of each
epoch (``nnx.metrics.Average``, ``Accuracy``), and on the evaluated splits
:class:`~cwsa_jax.nnx.SweepMetric` and :class:`~cwsa_jax.nnx.CalibrationMetric`,
batch by batch, whose exact sums give the same sweep and ECE as one pass over
all the predictions. AURC, E-AURC and AUGRC need every confidence in order and
are computed once from the predictions.

Input pipeline: the training split is copied to the device once; a step
receives the index of its batch and gathers the batch inside the jitted step
(:func:`~cwsa_jax.training.data.gather_batch`) from the epoch's permutation,
copied once per epoch. The model, optimizer and metric state goes through
the step functionally (``nnx.split`` / ``nnx.merge``) and is donated, so the
step reuses its buffers. There are no host batch arrays and no per-step
copies left to prefetch. The batches, augmentation keys and updates are those
of a host-fed loop over :func:`~cwsa_jax.training.data.iterate_batches`.
On a CPU, :func:`reuse_host_memory` (called by ``cwsa-jax train``) lets
XLA reuse the memory of a step's temporaries instead of faulting it in again
at every step.

Data parallelism: the step runs on a one-axis mesh of local devices
(:func:`data_mesh`). The model, optimizer and metric state and the training
split are replicated on each device; each device gathers and processes its
share of the batch, and XLA's SPMD partitioner sums the gradients, the loss
and the batch-norm statistics over the devices, so a step is that of the
whole batch, as on one device (up to the order of float sums). XLA:CPU runs
one device's convolutions on about one core: ``cwsa-jax train`` asks for one
CPU device per core (:func:`request_cpu_devices`), and on a 2-core CPU two
devices take close to twice the steps per second of one.

Determinism: the validation split is seeded by the run's seed, the data order
of epoch e is a permutation seeded by (seed, e), augmentation keys are
``fold_in(key(seed), step)`` and the dropout stream is part of the
checkpointed model state, so a run killed and resumed from its last
checkpoint follows exactly the same steps as an uninterrupted one.

Layout: this module holds the model and optimizer, the validation split, the
jitted steps, checkpoints and the loop. The device setup (CPU device count,
host memory, the mesh and its shardings) lives in
:mod:`~cwsa_jax.training._devices`, the evaluation of the final logits
(metrics.json) in :mod:`~cwsa_jax.training._evaluation`; neither imports this
module, and their public names are importable from here as well.
"""

from __future__ import annotations

import functools
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
from jax.sharding import Mesh

from cwsa_jax import losses as cwsa_losses
from cwsa_jax.cli._util import write_json_atomic
from . import data as data_lib
from . import models
from .configs import TrainConfig
# Device setup and evaluation have modules of their own; their names stay importable from
# here, where cwsa-jax train, the benchmarks and the tests import them.
from ._devices import (available_cores, batch_sharded, check_device_count,  # noqa: F401
                       data_mesh, default_device_count, replicated, request_cpu_devices,
                       reuse_host_memory)
from ._evaluation import (AT_THRESHOLDS, ECE_BINS, SCORES, UNIT_INTERVAL_SCORES,  # noqa: F401
                          _update_evaluation, evaluate_logits, evaluate_predictions, evaluate_run,
                          make_evaluation_metrics, score_metrics,
                          select_deployment_threshold)

CHECKPOINT = "checkpoint.msgpack"
CHECKPOINT_META = "checkpoint.json"
PREDICTIONS = "predictions.npz"
# The second word of the validation split's numpy seed [seed, VALIDATION_STREAM]: epoch
# e's order uses [seed, e], and no run reaches 2**32 - 1 epochs.
VALIDATION_STREAM = 2**32 - 1


# --------------------------------------------------------------------------- model and optimizer


def create_model(config: TrainConfig, num_classes: int, *,
                 fused_norm_relu_pool: bool = True) -> nnx.Module:
  """The model of ``config`` (``fused_norm_relu_pool``: see :class:`models.ConvBlock`)."""
  rngs = nnx.Rngs(params=config.seed, dropout=config.seed + 1)
  sizes = {k: tuple(v) for k, v in (("widths", config.widths),
                                    ("convs_per_block", config.convs_per_block)) if v is not None}
  options = dict(num_classes=num_classes, fused_norm_relu_pool=fused_norm_relu_pool, rngs=rngs)
  if config.model == "mnist_cnn":
    return models.MnistCNN(**options, **sizes)
  if config.model == "cifar10_cnn":
    return models.Cifar10CNN(**options, **sizes)
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


# --------------------------------------------------------------------------- data


def validation_split(labels: np.ndarray, *, fraction: float, seed: int,
                     num_classes: int) -> tuple[np.ndarray, np.ndarray]:
  """Indices ``(train, validation)`` of a stratified, seeded hold-out, each sorted.

  Class c, with n_c examples, gives ``floor(fraction * n_c + 1/2)`` of them to
  the validation split, the first ones in a permutation seeded by
  ``[seed, VALIDATION_STREAM]``, so the class proportions are kept and the
  split depends only on ``(labels, fraction, seed)``.

  Args:
    labels: ``[N]`` integer labels of the training set, in ``[0, num_classes)``.
    fraction: share held out, in ``(0, 0.5]``.
    seed: seed (>= 0).
    num_classes: number of classes.

  Returns:
    ``(train, validation)`` int64 index arrays partitioning ``range(N)``.

  Raises:
    ValueError: a fraction outside (0, 0.5], or a validation split with fewer
      examples than classes.

  Examples:
    >>> import numpy as np
    >>> labels = np.repeat(np.arange(3), 10)
    >>> train, validation = validation_split(labels, fraction=0.2, seed=0, num_classes=3)
    >>> len(train), np.bincount(labels[validation]).tolist()
    (24, [2, 2, 2])
  """
  labels = np.asarray(labels)
  if not 0 < fraction <= 0.5:  # also rejects NaN
    raise ValueError(f"validation fraction must lie in (0, 0.5], got {fraction!r}")
  order = np.random.default_rng([seed, VALIDATION_STREAM]).permutation(len(labels))
  by_class = order[np.argsort(labels[order], kind="stable")]  # each class in seeded order
  counts = np.bincount(labels, minlength=num_classes)
  take = np.floor(fraction * counts + 0.5).astype(np.int64)
  starts = np.cumsum(counts) - counts
  validation = np.sort(np.concatenate([by_class[s:s + t] for s, t in zip(starts, take)]))
  if len(validation) < num_classes:
    raise ValueError(
        f"the validation split has {len(validation)} examples ({fraction:g} of {len(labels)} "
        f"training examples), fewer than the {num_classes} classes: raise the validation "
        "fraction or use more training data")
  train = np.setdiff1d(np.arange(len(labels)), validation)
  return train, validation


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


def cross_entropy(logits: jax.Array, labels: jax.Array, *, label_smoothing: float = 0.0) -> jax.Array:
  """Mean cross-entropy, against ``optax.smooth_labels`` targets when ``label_smoothing`` > 0."""
  if label_smoothing == 0:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
  targets = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype),
                                label_smoothing)
  return optax.softmax_cross_entropy(logits, targets).mean()


def loss_fn(model: nnx.Module, images: jax.Array, labels: jax.Array, config: TrainConfig,
            temperature: jax.Array | float | None = None):
  """Returns (loss, logits) for ``config.loss``:

  * ``ce``: cross-entropy;
  * ``cwsa``: CE + w (1 - soft CWSA) (:func:`cwsa_jax.losses.cwsa_regularized_loss`);
  * ``focal`` / ``inverse_focal``: :func:`cwsa_jax.losses.focal_loss` /
    :func:`~cwsa_jax.losses.inverse_focal_loss` with ``focal_gamma``;
  * ``soft_aurc``: CE + w soft AURC (:func:`cwsa_jax.losses.soft_aurc_regularized_loss`).

  With ``label_smoothing`` > 0, the CE term of ``ce``, ``cwsa`` and
  ``soft_aurc`` is taken against smoothed targets (:func:`cross_entropy`).
  """
  logits = model(images)
  smoothing = config.label_smoothing
  if config.loss == "cwsa":
    options = dict(tau=config.cwsa_tau, band=config.cwsa_band, correctness=config.cwsa_correctness,
                   temperature=config.cwsa_temperature if temperature is None else temperature)
    if smoothing == 0:
      loss = cwsa_losses.cwsa_regularized_loss(logits, labels, weight=config.cwsa_weight, **options)
    else:
      loss = (cross_entropy(logits, labels, label_smoothing=smoothing)
              + config.cwsa_weight * cwsa_losses.cwsa_surrogate_loss(logits, labels, **options))
  elif config.loss in ("focal", "inverse_focal"):
    focal = cwsa_losses.focal_loss if config.loss == "focal" else cwsa_losses.inverse_focal_loss
    loss = focal(logits, labels, gamma=config.focal_gamma)
  elif config.loss == "soft_aurc":
    if smoothing == 0:
      loss = cwsa_losses.soft_aurc_regularized_loss(
          logits, labels, weight=config.soft_aurc_weight, temperature=config.soft_aurc_temperature)
    else:
      loss = (cross_entropy(logits, labels, label_smoothing=smoothing)
              + config.soft_aurc_weight * cwsa_losses.soft_aurc_loss(
                  logits, labels, temperature=config.soft_aurc_temperature))
  elif config.loss == "ce":
    loss = cross_entropy(logits, labels, label_smoothing=smoothing)
  else:
    raise ValueError(f"unknown loss {config.loss!r}")
  return loss, logits


def _preprocess(images: jax.Array, config: TrainConfig, key: jax.Array | None) -> jax.Array:
  if key is not None and config.augment:
    images = data_lib.augment(key, images)
  return data_lib.normalize(images, dataset=config.dataset)


class _Accuracy(nnx.metrics.Average):
  """``nnx.metrics.Accuracy`` of integer labels with float32 correctness (the same totals).

  Data parallel, a bool sum is an int32 all-reduce of its own, one more point where the
  devices wait for each other; a float32 one joins the gradients' all-reduce
  (benchmarks/profile_train_step.py measures the waits).
  """

  def __init__(self):
    super().__init__("values")

  def update(self, *, logits: jax.Array, labels: jax.Array, **_) -> None:  # type: ignore[override]
    super().update(values=(logits.argmax(axis=-1) == labels).astype(jnp.float32))


def make_train_metrics() -> nnx.MultiMetric:
  """The training loss and accuracy of an epoch, accumulated on the device by ``train_step``."""
  return nnx.MultiMetric(loss=nnx.metrics.Average("loss"), accuracy=_Accuracy())


def make_train_step(config: TrainConfig, graphdef: Any, total_steps: int = 1,
                    mesh: Mesh | None = None) -> Callable:
  """``train_step(state, images, labels, order, batch) -> (state, loss)``: one optimizer step.

  ``graphdef, state = nnx.split((model, optimizer, metrics))``; the step
  returns the new ``state`` (``nnx.update`` puts it back into the objects).
  ``state`` is donated: the step reuses its buffers, and the arrays passed in
  are deleted. ``images`` ``[N, H, W, C]`` and ``labels`` ``[N]`` are the
  whole training split on the device, ``order`` ``[N]`` int32 the epoch's
  permutation and ``batch`` the index of the batch in the epoch, gathered by
  :func:`~cwsa_jax.training.data.gather_batch` inside the step. With ``s`` the
  optimizer's step count, the augmentation key is ``fold_in(key(seed), s)``
  and the CWSA temperature that of step ``s`` of ``total_steps``.

  With a ``mesh`` (:func:`data_mesh`), the step is data parallel: its inputs
  and outputs are replicated over the mesh's devices (:func:`replicated`), the
  batch is split over them (:func:`batch_sharded`) and XLA partitions the
  step; the arithmetic is that of the whole batch, as on one device.
  """
  base_key = jax.random.key(config.seed)
  shardings = {} if mesh is None else {"in_shardings": replicated(mesh),
                                       "out_shardings": replicated(mesh)}
  split = None if mesh is None else batch_sharded(mesh)

  @functools.partial(jax.jit, donate_argnums=0, **shardings)
  def train_step(state, images, labels, order, batch):
    model, optimizer, metrics = nnx.merge(graphdef, state)
    batch_images, batch_labels = data_lib.gather_batch(images, labels, order, batch,
                                                       batch_size=config.batch_size, sharding=split)
    step = optimizer.step[...]
    x = _preprocess(batch_images, config, jax.random.fold_in(base_key, step))
    temperature = cwsa_temperature(config, step, total_steps)
    grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
    (loss, logits), grads = grad_fn(model, x, batch_labels, config, temperature)
    optimizer.update(model, grads)
    metrics.update(loss=loss, logits=logits, labels=batch_labels)
    return nnx.state((model, optimizer, metrics)), loss

  return train_step


def make_predict(config: TrainConfig) -> Callable:
  """``predict(model, images) -> logits`` [B, K] float32 (call it in ``model.eval()`` mode)."""
  @nnx.jit
  def predict(model, images):
    return model(_preprocess(images, config, None)).astype(jnp.float32)

  return predict


def predict_logits(model: nnx.Module, images: np.ndarray, config: TrainConfig,
                   mesh: Mesh | None = None) -> np.ndarray:
  """Logits [N, K] (float32) in eval mode (batch-norm running stats, no dropout).

  With a ``mesh``, the model is replicated over its devices and each batch of
  ``eval_batch_size`` split over them (a last batch the device count does not
  divide is padded with its first image, whose logits are dropped); each
  example's logits do not depend on the others in eval mode.
  """
  model.eval()
  predict = make_predict(config)
  if mesh is not None:
    nnx.update(model, jax.device_put(nnx.state(model), replicated(mesh)))
  out = [np.asarray(predict(model, _eval_batch(images[i:i + config.eval_batch_size], mesh)))
         for i in range(0, len(images), config.eval_batch_size)]
  model.train()
  return np.concatenate(out)[:len(images)]


def _eval_batch(images: np.ndarray, mesh: Mesh | None) -> jax.Array:
  """A batch of images on the device, or split over the mesh (padded to a multiple of its size)."""
  if mesh is None:
    return jnp.asarray(images)
  pad = -len(images) % mesh.size
  if pad:
    images = np.concatenate([images, np.repeat(images[:1], pad, axis=0)])
  return jax.device_put(images, batch_sharded(mesh))


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
    self.bar = None
    if enabled:
      try:
        from tqdm.auto import tqdm  # noqa: PLC0415
      except ImportError:  # tqdm is optional: no progress bar
        return
      self.bar = tqdm(total=total, desc=desc, unit="step", file=sys.stderr, dynamic_ncols=True,
                      mininterval=1.0)

  def update(self, n: int, **postfix) -> None:
    if self.bar is not None:
      self.bar.set_postfix({k: f"{v:.4f}" for k, v in postfix.items()}, refresh=False)
      self.bar.update(n)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


# --------------------------------------------------------------------------- the loop


def train_and_evaluate(config: TrainConfig, workdir: str | os.PathLike, dataset: data_lib.Dataset, *,
                       max_steps: int | None = None, resume: bool = False,
                       progress: bool = True, devices: int | None = None) -> dict[str, Any]:
  """Trains, checkpoints every epoch, evaluates the validation and test splits; returns metrics.

  Writes into ``workdir``: ``checkpoint.msgpack`` / ``checkpoint.json`` (after
  every epoch), ``predictions.npz`` (test ``probs`` [N, K], ``labels`` [N],
  ``logits`` [N, K], the fitted ``temperature`` and the validation split's
  ``validation_logits`` and ``validation_labels``), ``metrics.json`` (see
  :func:`evaluate_run`) and ``config.json``.

  Args:
    config: the run's :class:`TrainConfig`.
    workdir: output folder (created).
    dataset: a :class:`cwsa_jax.training.data.Dataset`; ``config.val_fraction``
      of its training split is held out (:func:`validation_split`).
    max_steps: stop after this many optimizer steps in total (a short run).
    resume: continue from the checkpoint in ``workdir``.
    progress: show a progress bar.
    devices: train data parallel on this many local devices (:func:`data_mesh`;
      default: the most that split the batch evenly). The same seed gives the
      same data order, initialisation and augmentation on any count; the
      results agree up to the order of float sums. On a CPU,
      :func:`request_cpu_devices` (called by ``cwsa-jax train``) makes one
      device per core.

  Raises:
    ValueError: an invalid ``config``, a validation split with fewer examples
      than classes, a training split smaller than one batch, or a device count
      that is not available or does not divide the batch size.
  """
  config.validate()
  mesh = data_mesh(devices, config.batch_size)
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  start_time = time.time()
  train_index, validation_index = validation_split(
      dataset.train_labels, fraction=config.val_fraction, seed=config.seed,
      num_classes=dataset.num_classes)
  steps_per_epoch = data_lib.num_batches(len(train_index), batch_size=config.batch_size,
                                         drop_remainder=True)
  if steps_per_epoch < 1:
    raise ValueError(f"the training split ({len(train_index)} examples after holding out "
                     f"{len(validation_index)} for validation) is smaller than one batch "
                     f"({config.batch_size})")
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
  (workdir / "config.json").write_text(json.dumps({**config.__dict__, "max_steps": max_steps,
                                                   "devices": mesh.size}, indent=1))

  train_metrics = make_train_metrics()
  objects = (model, optimizer, train_metrics)
  graphdef, state = nnx.split(objects)
  train_step = make_train_step(config, graphdef, config.epochs * steps_per_epoch, mesh)
  # The training split lives on every device; a step gets only the index of its batch.
  on_mesh = replicated(mesh)
  images = jax.device_put(dataset.train_images[train_index], on_mesh)
  labels = jax.device_put(dataset.train_labels[train_index], on_mesh)
  bar = Progress(total_steps, f"{config.dataset}/{config.loss} seed {config.seed}", progress)
  bar.update(step)
  shown = step
  epoch = start_epoch
  while epoch < config.epochs and step < total_steps:
    # The metrics stay on the device; reading them every step would stall dispatch.
    train_metrics.reset()
    state = jax.device_put(nnx.state(objects), on_mesh)
    order = jax.device_put(data_lib.epoch_permutation(len(train_index), seed=config.seed,
                                                      epoch=epoch).astype(np.int32), on_mesh)
    for batch in range(min(steps_per_epoch, total_steps - step)):
      state, _ = train_step(state, images, labels, order, np.int32(batch))
      step += 1
      if step % 20 == 0 or step == total_steps:
        nnx.update(objects, state)
        now = train_metrics.compute()
        bar.update(step - shown, loss=float(now["loss"]), acc=float(now["accuracy"]),
                   epoch=epoch + 1)
        shown = step
    nnx.update(objects, state)  # the objects hold the arrays the last step returned
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
  del images, labels, state

  test_labels = np.asarray(dataset.test_labels)
  validation_labels = np.asarray(dataset.train_labels[validation_index])
  test_logits = predict_logits(model, dataset.test_images, config, mesh)
  validation_logits = predict_logits(model, dataset.train_images[validation_index], config, mesh)
  metrics, test_probs, temperature = evaluate_run(validation_logits, validation_labels,
                                                  test_logits, test_labels, config)
  tmp = workdir / ".predictions.tmp.npz"
  np.savez_compressed(tmp, probs=test_probs.astype(np.float32), labels=test_labels,
                      logits=test_logits, temperature=np.float32(temperature),
                      validation_logits=validation_logits, validation_labels=validation_labels)
  os.replace(tmp, workdir / PREDICTIONS)
  metrics.update({
      "dataset": config.dataset, "loss": config.loss, "seed": config.seed, "epochs": epoch,
      "steps": step, "wall_seconds": elapsed_before + time.time() - start_time,
      "data_source": dataset.source, "device": str(mesh.devices.flat[0].device_kind),
      "devices": mesh.size,
      "split": {"train": int(len(train_index)), "validation": int(len(validation_index)),
                "val_fraction": config.val_fraction, "stratified": True},
      "history": history})
  write_json_atomic(workdir / "metrics.json", metrics)
  return metrics
