"""Training configurations: small functions returning defaults (flax examples style).

``get_config(dataset)`` returns the default for a dataset; a variant
overrides only what differs, e.g. ``dataclasses.replace(get_config("mnist"),
loss="cwsa")``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

LOSSES = ("ce", "cwsa", "focal", "inverse_focal", "soft_aurc")
# Losses with a cross-entropy term, which --label-smoothing smooths.
SMOOTHABLE_LOSSES = ("ce", "cwsa", "soft_aurc")
DATASETS = ("mnist", "cifar10")
MODELS = ("mnist_cnn", "cifar10_cnn")
OPTIMIZERS = ("adam", "sgd")
CORRECTNESS = ("probability", "hard")
THRESHOLD_METRICS = ("cwsa", "cwsa_plus", "selective_accuracy")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Everything that determines a training run (with the seed, it fixes the result)."""

  dataset: str
  model: str
  epochs: int
  batch_size: int
  optimizer: str  # "adam" or "sgd" (Nesterov momentum)
  learning_rate: float
  weight_decay: float
  warmup_epochs: float
  augment: bool
  widths: tuple[int, ...] | None = None  # model channel widths (None: the model's default)
  convs_per_block: tuple[int, ...] | None = None
  loss: str = "ce"
  # Label smoothing of the cross-entropy term (optax.smooth_labels); 0 = none.
  label_smoothing: float = 0.0
  # The CWSA-regularized loss: CE + weight * (1 - soft CWSA(tau, temperature)).
  cwsa_weight: float = 0.5
  cwsa_tau: float = 0.5
  cwsa_temperature: float = 0.05
  # If set, the temperature anneals geometrically from this value at step 0 to
  # cwsa_temperature at the last step: T(s) = T0 (T1 / T0)^(s / total_steps).
  cwsa_temperature_start: float | None = None
  cwsa_band: tuple[float, float] | None = None
  cwsa_correctness: str = "probability"
  # focal and inverse_focal: the exponent gamma of (1 -/+ p_y)^gamma.
  focal_gamma: float = 3.0
  # soft_aurc: CE + weight * soft AURC with pairwise sigmoids of this temperature.
  soft_aurc_weight: float = 1.0
  soft_aurc_temperature: float = 0.01
  # The share of the training split held out (stratified, seeded) for temperature scaling
  # and the choice of the deployment threshold.
  val_fraction: float = 0.1
  # The deployment threshold: the grid value of `thresholds` maximising this metric on the
  # temperature-scaled validation confidences, under the optional constraints.
  threshold_metric: str = "cwsa"
  threshold_min_coverage: float | None = None
  threshold_max_risk: float | None = None
  seed: int = 0
  eval_batch_size: int = 1000
  thresholds: tuple[float, ...] = tuple(round(0.5 + 0.01 * i, 2) for i in range(50))

  def validate(self) -> None:
    """Raises ``ValueError`` naming the first invalid field (NaN and inf are invalid numbers)."""
    _choice("dataset", self.dataset, DATASETS)
    _choice("model", self.model, MODELS)
    _integer("epochs", self.epochs, 1)
    _integer("batch size", self.batch_size, 1)
    _choice("optimizer", self.optimizer, OPTIMIZERS)
    _number("learning rate", self.learning_rate, "> 0", lambda x: x > 0)
    _number("weight decay", self.weight_decay, ">= 0", lambda x: x >= 0)
    _number("warmup epochs", self.warmup_epochs, ">= 0", lambda x: x >= 0)
    _require(isinstance(self.augment, bool), f"augment must be True or False, got {self.augment!r}")
    for name in ("widths", "convs_per_block"):
      sizes = getattr(self, name)
      _require(sizes is None or (len(sizes) > 0 and all(_is_int(s) and s >= 1 for s in sizes)),
               f"{name} must be positive integers, got {sizes!r}")
    _choice("loss", self.loss, LOSSES)
    _number("label smoothing", self.label_smoothing, "lie in [0, 1)", lambda x: 0 <= x < 1,
            verb="")
    _require(self.label_smoothing == 0 or self.loss in SMOOTHABLE_LOSSES,
             f"label smoothing applies to the cross-entropy term of the losses "
             f"{', '.join(SMOOTHABLE_LOSSES)}, not to loss {self.loss!r}")
    _number("cwsa weight", self.cwsa_weight, ">= 0", lambda x: x >= 0)
    _number("cwsa tau", self.cwsa_tau, "lie in [0, 1)", lambda x: 0 <= x < 1, verb="")
    _number("cwsa temperature", self.cwsa_temperature, "> 0", lambda x: x > 0)
    if self.cwsa_temperature_start is not None:
      _number("cwsa temperature start", self.cwsa_temperature_start, "> 0", lambda x: x > 0)
    if self.cwsa_band is not None:
      band = tuple(self.cwsa_band)
      _require(len(band) == 2 and all(_is_number(b) for b in band) and 0 <= band[0] < band[1] < 1,
               f"cwsa band must be (low, high) with 0 <= low < high < 1, got {self.cwsa_band!r}")
    _choice("cwsa correctness", self.cwsa_correctness, CORRECTNESS)
    _number("focal gamma", self.focal_gamma, ">= 0", lambda x: x >= 0)
    _number("soft AURC weight", self.soft_aurc_weight, ">= 0", lambda x: x >= 0)
    _number("soft AURC temperature", self.soft_aurc_temperature, "> 0", lambda x: x > 0)
    _number("validation fraction", self.val_fraction, "lie in (0, 0.5]", lambda x: 0 < x <= 0.5,
            verb="")
    _choice("threshold metric", self.threshold_metric, THRESHOLD_METRICS)
    for name in ("threshold_min_coverage", "threshold_max_risk"):
      value = getattr(self, name)
      if value is not None:
        _number(name.replace("_", " "), value, "lie in [0, 1]", lambda x: 0 <= x <= 1, verb="")
    _integer("seed", self.seed, 0)
    _integer("eval batch size", self.eval_batch_size, 1)
    _require(len(self.thresholds) > 0 and all(_is_number(t) and 0 <= t < 1 for t in self.thresholds),
             f"thresholds must be a non-empty sequence of values in [0, 1), got {self.thresholds!r}")


def _require(ok: bool, message: str) -> None:
  if not ok:
    raise ValueError(message)


def _is_int(x) -> bool:
  return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _is_number(x) -> bool:
  return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) \
      and math.isfinite(x)


def _choice(name: str, value, valid: tuple[str, ...]) -> None:
  _require(value in valid, f"unknown {name.replace('_', ' ')} {value!r}; valid: {', '.join(valid)}")


def _integer(name: str, value, minimum: int) -> None:
  _require(_is_int(value) and value >= minimum, f"{name} must be an integer >= {minimum}, got {value!r}")


def _number(name: str, value, condition: str, ok, *, verb: str = "be ") -> None:
  """A finite number satisfying ``ok``; the message says '<name> must <verb><condition>'."""
  _require(_is_number(value) and ok(value), f"{name} must {verb}{condition}, got {value!r}")


def mnist_config() -> TrainConfig:
  """MNIST: the small CNN with one conv per block (the cheaper variant on a CPU), Adam with
  warmup + cosine decay, 5 epochs."""
  return TrainConfig(dataset="mnist", model="mnist_cnn", epochs=5, batch_size=128, optimizer="adam",
                     learning_rate=2e-3, weight_decay=0.0, warmup_epochs=0.5, augment=False,
                     convs_per_block=(1, 1))


def cifar10_config() -> TrainConfig:
  """CIFAR-10: the VGG-style CNN with narrower blocks (24/48/96 channels, sized for a CPU),
  SGD + Nesterov, warmup + cosine, crop/flip augmentation."""
  return TrainConfig(dataset="cifar10", model="cifar10_cnn", epochs=8, batch_size=128,
                     optimizer="sgd", learning_rate=0.1, weight_decay=5e-4, warmup_epochs=1.0,
                     augment=True, widths=(24, 48, 96), convs_per_block=(1, 2, 2))


CONFIGS = {"mnist": mnist_config, "cifar10": cifar10_config}


def get_config(dataset: str) -> TrainConfig:
  if dataset not in CONFIGS:
    raise ValueError(f"unknown dataset {dataset!r}; valid datasets: {', '.join(CONFIGS)}")
  return CONFIGS[dataset]()
