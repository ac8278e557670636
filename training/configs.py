"""Training configurations: small functions returning defaults (flax examples style).

``get_config(dataset)`` returns the default for a dataset; a variant
overrides only what differs, e.g. ``dataclasses.replace(get_config("mnist"),
loss="cwsa")``.
"""

from __future__ import annotations

import dataclasses

LOSSES = ("ce", "cwsa")


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
  # The CWSA-regularized loss: CE + weight * (1 - soft CWSA(tau, temperature)).
  cwsa_weight: float = 0.5
  cwsa_tau: float = 0.5
  cwsa_temperature: float = 0.05
  # If set, the temperature anneals geometrically from this value at step 0 to
  # cwsa_temperature at the last step: T(s) = T0 (T1 / T0)^(s / total_steps).
  cwsa_temperature_start: float | None = None
  cwsa_band: tuple[float, float] | None = None
  cwsa_correctness: str = "probability"
  seed: int = 0
  eval_batch_size: int = 1000
  thresholds: tuple[float, ...] = tuple(round(0.5 + 0.01 * i, 2) for i in range(50))

  def validate(self) -> None:
    if self.loss not in LOSSES:
      raise ValueError(f"unknown loss {self.loss!r}; valid losses: {', '.join(LOSSES)}")
    if self.epochs < 1:
      raise ValueError(f"epochs must be >= 1, got {self.epochs}")
    if self.batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
    if self.optimizer not in ("adam", "sgd"):
      raise ValueError(f"unknown optimizer {self.optimizer!r}; valid: adam, sgd")
    if self.cwsa_weight < 0:
      raise ValueError(f"cwsa weight must be >= 0, got {self.cwsa_weight}")
    if not 0.0 <= self.cwsa_tau < 1.0:
      raise ValueError(f"cwsa tau must lie in [0, 1), got {self.cwsa_tau}")
    if self.cwsa_temperature <= 0:
      raise ValueError(f"cwsa temperature must be > 0, got {self.cwsa_temperature}")
    if self.cwsa_temperature_start is not None and self.cwsa_temperature_start <= 0:
      raise ValueError(f"cwsa temperature start must be > 0, got {self.cwsa_temperature_start}")


def mnist_config() -> TrainConfig:
  """MNIST: the small CNN with one conv per block (4.3M multiply-adds), Adam with warmup + cosine
  decay, 5 epochs."""
  return TrainConfig(dataset="mnist", model="mnist_cnn", epochs=5, batch_size=128, optimizer="adam",
                     learning_rate=2e-3, weight_decay=0.0, warmup_epochs=0.5, augment=False,
                     convs_per_block=(1, 1))


def cifar10_config() -> TrainConfig:
  """CIFAR-10: the VGG-style CNN (24/48/96 channels, ~17M multiply-adds per image, sized
  for a 2-core CPU), SGD + Nesterov, warmup + cosine, crop/flip augmentation."""
  return TrainConfig(dataset="cifar10", model="cifar10_cnn", epochs=8, batch_size=128,
                     optimizer="sgd", learning_rate=0.1, weight_decay=5e-4, warmup_epochs=1.0,
                     augment=True, widths=(24, 48, 96), convs_per_block=(1, 2, 2))


CONFIGS = {"mnist": mnist_config, "cifar10": cifar10_config}


def get_config(dataset: str) -> TrainConfig:
  if dataset not in CONFIGS:
    raise ValueError(f"unknown dataset {dataset!r}; valid datasets: {', '.join(CONFIGS)}")
  return CONFIGS[dataset]()
