"""The paper's synthetic classifiers and stress tests, seeded with JAX keys.

Every synthetic model draws ``num_samples`` labels and, for each sample,
predicts the true label with probability ``p_correct`` and otherwise a
uniformly random label (which can still be right, so the accuracy is
``p_correct + (1 - p_correct) / num_classes``). The confidence depends on
whether the prediction is *actually* correct:

.. math::

  c_i \\sim \\begin{cases}
    \\mathcal{U}(a_+, b_+) & \\hat y_i = y_i \\\\
    \\mathcal{U}(a_-, b_-) & \\hat y_i \\neq y_i
  \\end{cases}

The presets are the paper's models (section "Synthetic Model Simulation" and
the published code, ``n = 1000`` samples, 3 classes):

=============== ========= ============== ==============
model           p_correct correct conf.  wrong conf.
=============== ========= ============== ==============
calibrated      0.9       U[0.8, 1.0]    U[0.5, 0.7]
overconfident   0.9       U[0.9, 1.0]    U[0.9, 1.0]
underconfident  0.9       U[0.4, 0.6]    U[0.4, 0.6]
perfect         1.0       exactly 1.0    (none)
random          0.0       U[0.3, 1.0]    U[0.3, 1.0]
=============== ========= ============== ==============

Every parameter can be overridden by keyword. One script of the published
code uses ``p_correct = 0.7`` for the overconfident model; the paper's table
matches 0.9. The published ``simulate_models.py`` picks the confidence range
from the coin flip rather than from the actual outcome (a lucky random guess
then gets a low confidence); its stress-test scripts, and this module, use the
actual outcome.

Stress tests (as in the published ``stress_noise.py`` and
``stress_imbalance.py``, plus a confidence shift):

* :func:`with_label_noise`: a fraction of the labels (exactly
  ``floor(rate * n)`` samples) replaced by a different, uniformly drawn class;
  predictions and confidences are kept, so the model looks overconfident
  against the noisy labels.
* :func:`imbalanced`: class 0 takes exactly ``floor(class0_share * n)``
  samples, the others are uniform over classes 1..K-1.
* :func:`with_confidence_shift`: every confidence moved by ``shift`` and
  clipped to [0, 1] (positive: overconfident, negative: underconfident).

All functions are pure and jittable with ``num_samples`` and ``num_classes``
static; they are ``jax.vmap``-able over keys (many seeds in one call) and over
the numeric parameters::

  keys = jax.random.split(jax.random.key(0), 100)
  batch = jax.vmap(lambda k: synthetic.calibrated(k))(keys)   # fields [100, 1000]

Value checks (ranges, probabilities) run on concrete arguments only; under
``jit`` / ``vmap`` the parameters are used as given.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cwsa_jax import _validation

__all__ = [
    "MODELS",
    "PAPER_NUM_CLASSES",
    "PAPER_NUM_SAMPLES",
    "PAPER_PARAMETERS",
    "SyntheticPredictions",
    "calibrated",
    "generate",
    "imbalanced",
    "overconfident",
    "perfect",
    "predict",
    "random",
    "sample_models",
    "simulate",
    "to_probs",
    "underconfident",
    "with_confidence_shift",
    "with_label_noise",
]

PAPER_NUM_SAMPLES = 1000
PAPER_NUM_CLASSES = 3

MODELS = ("calibrated", "overconfident", "underconfident", "perfect", "random")

PAPER_PARAMETERS: dict[str, dict[str, Any]] = {
    "calibrated": dict(p_correct=0.9, correct_confidence=(0.8, 1.0), wrong_confidence=(0.5, 0.7)),
    "overconfident": dict(p_correct=0.9, correct_confidence=(0.9, 1.0), wrong_confidence=(0.9, 1.0)),
    "underconfident": dict(p_correct=0.9, correct_confidence=(0.4, 0.6), wrong_confidence=(0.4, 0.6)),
    "perfect": dict(p_correct=1.0, correct_confidence=(1.0, 1.0), wrong_confidence=(1.0, 1.0)),
    "random": dict(p_correct=0.0, correct_confidence=(0.3, 1.0), wrong_confidence=(0.3, 1.0)),
}


class SyntheticPredictions(NamedTuple):
  """One synthetic model's outputs; every field has shape [..., n].

  Attributes:
    labels: int32 true labels in [0, num_classes).
    predictions: int32 predicted labels.
    confidences: float32 top-label confidences in [0, 1].
    correct: bool, ``predictions == labels``.
  """
  labels: jax.Array
  predictions: jax.Array
  confidences: jax.Array
  correct: jax.Array


# --------------------------------------------------------------------------
# Checks (concrete values only)
# --------------------------------------------------------------------------


def _check_static_int(value: Any, name: str, minimum: int) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise ValueError(f"{name} must be a Python int >= {minimum} (it fixes array shapes), got {value!r}")
  if value < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got {value}")
  return int(value)


def _check_probability(value: Any, name: str) -> jax.Array:
  x = _validation.as_float_array(value, name)
  if x.ndim != 0:
    raise ValueError(f"{name} must be a scalar, got shape {x.shape}")
  if _validation.is_concrete(x):
    v = float(x)
    if not (0.0 <= v <= 1.0):
      raise ValueError(f"{name} must lie in [0, 1], got {v}")
  return x.astype(jnp.float32)


def _as_scalar(value: Any) -> Any:
  """The value itself when concrete (keeps float64 precision), else the tracer."""
  return value if _validation.is_concrete(value) else jnp.asarray(value)


def _check_range(value: Any, name: str) -> tuple[jax.Array, jax.Array]:
  try:
    low, high = value
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be a pair (low, high), got {value!r}") from None
  low = _check_probability(low, f"{name}[0]")
  high = _check_probability(high, f"{name}[1]")
  if _validation.is_concrete(low, high) and float(low) > float(high):
    raise ValueError(f"{name} must have low <= high, got ({float(low)}, {float(high)})")
  return low, high


def _check_sample(sample: Any) -> SyntheticPredictions:
  if not isinstance(sample, SyntheticPredictions):
    raise ValueError(f"expected a SyntheticPredictions, got {type(sample).__name__}")
  return sample


# --------------------------------------------------------------------------
# Generators
# --------------------------------------------------------------------------


def _scaled(u, low, high):
  # low + u (high - low), clipped so that rounding never leaves [low, high];
  # low == high gives exactly low (the perfect model's confidence 1.0).
  return jnp.clip(low + u * (high - low), low, high)


def _integers(u, low: int, high: int):
  """Uniform integers in [low, high) from uniforms u in [0, 1)."""
  return jnp.clip(low + jnp.floor(u * (high - low)).astype(jnp.int32), low, high - 1)


def _rule(u, labels, p_correct, correct_low, correct_high, wrong_low, wrong_high, num_classes):
  """The prediction rule from four rows of uniforms u [4, n]."""
  use_true = u[0] < p_correct
  guess = _integers(u[1], 0, num_classes)
  predictions = jnp.where(use_true, labels, guess)
  correct = predictions == labels
  confidences = jnp.where(correct, _scaled(u[2], correct_low, correct_high),
                          _scaled(u[3], wrong_low, wrong_high))
  return SyntheticPredictions(labels, predictions, confidences, correct)


# Each generator draws all its randomness as one [rows, n] uniform array: one
# threefry call per generator keeps XLA compile times short.


def predict(key: jax.Array, labels: jax.Array, *, num_classes: int = PAPER_NUM_CLASSES,
            p_correct: Any = 0.9, correct_confidence: Any = (0.8, 1.0),
            wrong_confidence: Any = (0.5, 0.7)) -> SyntheticPredictions:
  """Applies the synthetic prediction rule to given labels.

  With probability ``p_correct`` the prediction is the true label, otherwise a
  uniformly random label; the confidence is drawn by outcome:

  .. math::

    \\hat y_i = \\begin{cases} y_i & \\text{w.p. } p \\\\
      \\mathcal{U}\\{0, \\dots, K-1\\} & \\text{otherwise} \\end{cases},
    \\qquad
    c_i \\sim \\mathcal{U}(a_\\pm, b_\\pm) \\text{ as } \\hat y_i = y_i \\text{ or not}.

  Args:
    key: a JAX PRNG key.
    labels: [n] integer labels in [0, num_classes).
    num_classes: K >= 2 (static).
    p_correct: probability p of predicting the true label.
    correct_confidence: (a+, b+) range for correct predictions.
    wrong_confidence: (a-, b-) range for wrong predictions.

  Returns:
    :class:`SyntheticPredictions` with fields of shape [n].

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from cwsa_jax import synthetic
    >>> s = synthetic.predict(jax.random.key(0), jnp.zeros(5, jnp.int32), p_correct=1.0)
    >>> print(s.correct.tolist(), bool((s.confidences >= 0.8).all()))
    [True, True, True, True, True] True
  """
  num_classes = _check_static_int(num_classes, "num_classes", 2)
  labels = _validation.as_labels(labels, "labels", num_classes=num_classes).astype(jnp.int32)
  if labels.ndim != 1:
    raise ValueError(f"labels must be 1-D [n] (use jax.vmap for batches), got shape {labels.shape}")
  p_correct = _check_probability(p_correct, "p_correct")
  correct_low, correct_high = _check_range(correct_confidence, "correct_confidence")
  wrong_low, wrong_high = _check_range(wrong_confidence, "wrong_confidence")
  return _predict(key, labels, p_correct, correct_low, correct_high, wrong_low, wrong_high,
                  num_classes=num_classes)


@functools.partial(jax.jit, static_argnames=("num_classes",))
def _predict(key, labels, p_correct, correct_low, correct_high, wrong_low, wrong_high, *,
             num_classes):
  u = jax.random.uniform(key, (4, labels.shape[0]), jnp.float32)
  return _rule(u, labels, p_correct, correct_low, correct_high, wrong_low, wrong_high, num_classes)


def simulate(key: jax.Array, *, num_samples: int = PAPER_NUM_SAMPLES,
             num_classes: int = PAPER_NUM_CLASSES, p_correct: Any = 0.9,
             correct_confidence: Any = (0.8, 1.0),
             wrong_confidence: Any = (0.5, 0.7)) -> SyntheticPredictions:
  """A synthetic classifier on uniformly drawn labels (the general form of the presets).

  Labels are uniform over ``num_classes``; predictions and confidences follow
  :func:`predict`. The defaults are the paper's calibrated model.

  Args:
    key: a JAX PRNG key (``jax.vmap`` over a batch of keys for many seeds).
    num_samples: n >= 1 (static).
    num_classes: K >= 2 (static).
    p_correct: probability of predicting the true label.
    correct_confidence: (low, high) confidence range of correct predictions.
    wrong_confidence: (low, high) confidence range of wrong predictions.

  Returns:
    :class:`SyntheticPredictions` with fields of shape [num_samples].

  Examples:
    >>> import jax
    >>> from cwsa_jax import synthetic
    >>> s = synthetic.simulate(jax.random.key(0), num_samples=4000)
    >>> print(round(float(s.correct.mean()), 1))
    0.9
  """
  num_samples = _check_static_int(num_samples, "num_samples", 1)
  num_classes = _check_static_int(num_classes, "num_classes", 2)
  p_correct = _check_probability(p_correct, "p_correct")
  correct_low, correct_high = _check_range(correct_confidence, "correct_confidence")
  wrong_low, wrong_high = _check_range(wrong_confidence, "wrong_confidence")
  return _simulate(key, p_correct, correct_low, correct_high, wrong_low, wrong_high,
                   num_samples=num_samples, num_classes=num_classes)


@functools.partial(jax.jit, static_argnames=("num_samples", "num_classes"))
def _simulate(key, p_correct, correct_low, correct_high, wrong_low, wrong_high, *, num_samples,
              num_classes):
  u = jax.random.uniform(key, (5, num_samples), jnp.float32)
  labels = _integers(u[0], 0, num_classes)
  return _rule(u[1:], labels, p_correct, correct_low, correct_high, wrong_low, wrong_high,
               num_classes)


def _preset(name: str, key: jax.Array, num_samples: int, num_classes: int,
            overrides: dict[str, Any]) -> SyntheticPredictions:
  params = dict(PAPER_PARAMETERS[name])
  unknown = set(overrides) - set(params)
  if unknown:
    raise ValueError(f"unknown parameter(s) for the {name} model: {sorted(unknown)}; "
                     f"expected some of {sorted(params)}")
  params.update(overrides)
  return simulate(key, num_samples=num_samples, num_classes=num_classes, **params)


def calibrated(key: jax.Array, *, num_samples: int = PAPER_NUM_SAMPLES,
               num_classes: int = PAPER_NUM_CLASSES, **overrides: Any) -> SyntheticPredictions:
  """The paper's calibrated model: right w.p. ~0.93, confidence U[0.8, 1] if right, U[0.5, 0.7] if wrong.

  Keyword ``overrides`` replace ``p_correct``, ``correct_confidence`` or
  ``wrong_confidence`` (see :func:`simulate`).

  Examples:
    >>> import jax
    >>> from cwsa_jax import synthetic
    >>> s = synthetic.calibrated(jax.random.key(0), num_samples=8)
    >>> print(s.confidences.shape, s.correct.dtype)
    (8,) bool
  """
  return _preset("calibrated", key, num_samples, num_classes, overrides)


def overconfident(key: jax.Array, *, num_samples: int = PAPER_NUM_SAMPLES,
                  num_classes: int = PAPER_NUM_CLASSES, **overrides: Any) -> SyntheticPredictions:
  """The paper's overconfident model: right w.p. ~0.93, confidence U[0.9, 1] whatever the outcome.

  Keyword ``overrides`` as in :func:`calibrated`.
  """
  return _preset("overconfident", key, num_samples, num_classes, overrides)


def underconfident(key: jax.Array, *, num_samples: int = PAPER_NUM_SAMPLES,
                   num_classes: int = PAPER_NUM_CLASSES, **overrides: Any) -> SyntheticPredictions:
  """The paper's underconfident model: right w.p. ~0.93, confidence U[0.4, 0.6] whatever the outcome.

  Keyword ``overrides`` as in :func:`calibrated`.
  """
  return _preset("underconfident", key, num_samples, num_classes, overrides)


def perfect(key: jax.Array, *, num_samples: int = PAPER_NUM_SAMPLES,
            num_classes: int = PAPER_NUM_CLASSES, **overrides: Any) -> SyntheticPredictions:
  """The paper's perfect model: always right, confidence exactly 1.0.

  Keyword ``overrides`` as in :func:`calibrated`.
  """
  return _preset("perfect", key, num_samples, num_classes, overrides)


def random(key: jax.Array, *, num_samples: int = PAPER_NUM_SAMPLES,
           num_classes: int = PAPER_NUM_CLASSES, **overrides: Any) -> SyntheticPredictions:
  """The paper's random model: a uniformly random label, confidence U[0.3, 1.0].

  Accuracy is 1/K. Confidences below 1/K cannot be a maximum softmax
  probability, so this model has no probability-vector form for K = 3
  (:func:`to_probs` refuses it). Keyword ``overrides`` as in :func:`calibrated`.
  """
  return _preset("random", key, num_samples, num_classes, overrides)


_PRESETS = {
    "calibrated": calibrated,
    "overconfident": overconfident,
    "underconfident": underconfident,
    "perfect": perfect,
    "random": random,
}


def generate(model: str, key: jax.Array, *, num_samples: int = PAPER_NUM_SAMPLES,
             num_classes: int = PAPER_NUM_CLASSES, **overrides: Any) -> SyntheticPredictions:
  """Draws from the named paper model (one of :data:`MODELS`), parameters overridable.

  Examples:
    >>> import jax
    >>> from cwsa_jax import synthetic
    >>> keys = jax.random.split(jax.random.key(0), 3)
    >>> batch = jax.vmap(lambda k: synthetic.generate("perfect", k, num_samples=5))(keys)
    >>> print(batch.confidences.shape, float(batch.confidences.min()), bool(batch.correct.all()))
    (3, 5) 1.0 True
  """
  if model not in _PRESETS:
    raise ValueError(f"model must be one of {MODELS}, got {model!r}")
  return _PRESETS[model](key, num_samples=num_samples, num_classes=num_classes, **overrides)


def sample_models(key: jax.Array, *, num_seeds: int, models: tuple[str, ...] = MODELS,
                  num_samples: int = PAPER_NUM_SAMPLES,
                  num_classes: int = PAPER_NUM_CLASSES) -> SyntheticPredictions:
  """Draws several paper models for many seeds in one compiled call.

  Model ``i`` uses the keys ``jax.random.split(jax.random.fold_in(key, i), num_seeds)``;
  the draw is ``jax.vmap`` over the models' parameters and over the keys.

  Args:
    key: a JAX PRNG key.
    num_seeds: S >= 1 seeds per model (static).
    models: names from :data:`MODELS` (default: all five, in that order).
    num_samples: n >= 1 (static).
    num_classes: K >= 2 (static).

  Returns:
    :class:`SyntheticPredictions` with fields of shape [len(models), S, n].

  Examples:
    >>> import jax
    >>> from cwsa_jax import synthetic
    >>> batch = synthetic.sample_models(jax.random.key(0), num_seeds=3)
    >>> print(batch.confidences.shape, bool(batch.correct[3].all()))
    (5, 3, 1000) True
  """
  num_seeds = _check_static_int(num_seeds, "num_seeds", 1)
  num_samples = _check_static_int(num_samples, "num_samples", 1)
  num_classes = _check_static_int(num_classes, "num_classes", 2)
  models = tuple(models)
  for m in models:
    if m not in PAPER_PARAMETERS:
      raise ValueError(f"model must be one of {MODELS}, got {m!r}")
  params = [PAPER_PARAMETERS[m] for m in models]
  p_correct = jnp.array([p["p_correct"] for p in params], jnp.float32)
  correct_range = jnp.array([p["correct_confidence"] for p in params], jnp.float32)
  wrong_range = jnp.array([p["wrong_confidence"] for p in params], jnp.float32)
  return _sample_models(key, p_correct, correct_range, wrong_range, num_seeds=num_seeds,
                        num_samples=num_samples, num_classes=num_classes)


@functools.partial(jax.jit, static_argnames=("num_seeds", "num_samples", "num_classes"))
def _sample_models(key, p_correct, correct_range, wrong_range, *, num_seeds, num_samples,
                   num_classes):
  def one_model(i, p, right, wrong):
    keys = jax.random.split(jax.random.fold_in(key, i), num_seeds)
    return jax.vmap(lambda k: _simulate(k, p, right[0], right[1], wrong[0], wrong[1],
                                        num_samples=num_samples, num_classes=num_classes))(keys)

  index = jnp.arange(p_correct.shape[0])
  return jax.vmap(one_model)(index, p_correct, correct_range, wrong_range)


# --------------------------------------------------------------------------
# Stress tests
# --------------------------------------------------------------------------


def _fraction_count(fraction: Any, n: int) -> Any:
  """floor(fraction * n): exact in float64 for a concrete fraction (as the
  published ``int(rate * N)``), in float32 with a small guard when traced."""
  if _validation.is_concrete(fraction):
    return int(np.float64(np.asarray(fraction, dtype=np.float64)) * n)
  return jnp.floor(fraction.astype(jnp.float32) * n + 1e-3).astype(jnp.int32)


def _exact_fraction_mask(u: jax.Array, count: Any) -> jax.Array:
  """[n] bool with exactly ``count`` True entries at the positions of the smallest uniforms u."""
  rank = jnp.argsort(jnp.argsort(u))
  return rank < count


def with_label_noise(key: jax.Array, sample: SyntheticPredictions, *, rate: Any,
                     num_classes: int = PAPER_NUM_CLASSES) -> SyntheticPredictions:
  """Replaces exactly floor(rate * n) labels by a different, uniformly drawn class.

  .. math::

    y'_i = (y_i + U\\{1, \\dots, K-1\\}) \\bmod K \\text{ for the noisy samples},
    \\qquad \\kappa'_i = [\\hat y_i = y'_i].

  Predictions and confidences are unchanged, so a model that was calibrated on
  clean labels becomes overconfident on the noisy ones.

  Args:
    key: a JAX PRNG key.
    sample: a 1-D :class:`SyntheticPredictions` (use ``jax.vmap`` for batches).
    rate: fraction of labels to corrupt, in [0, 1].
    num_classes: K >= 2 (static).

  Returns:
    :class:`SyntheticPredictions` with the noisy labels and recomputed ``correct``.

  Examples:
    >>> import jax
    >>> from cwsa_jax import synthetic
    >>> s = synthetic.perfect(jax.random.key(0), num_samples=1000)
    >>> noisy = synthetic.with_label_noise(jax.random.key(1), s, rate=0.3)
    >>> print(int(noisy.correct.sum()))
    700
  """
  sample = _check_sample(sample)
  num_classes = _check_static_int(num_classes, "num_classes", 2)
  _check_probability(rate, "rate")
  if sample.labels.ndim != 1:
    raise ValueError(f"sample must be 1-D [n] (use jax.vmap for batches), got shape {sample.labels.shape}")
  n = sample.labels.shape[0]
  return _label_noise(key, sample, _fraction_count(_as_scalar(rate), n), num_classes=num_classes)


@functools.partial(jax.jit, static_argnames=("num_classes",))
def _label_noise(key, sample, count, *, num_classes):
  u = jax.random.uniform(key, (2, sample.labels.shape[0]), jnp.float32)
  noisy = _exact_fraction_mask(u[0], count)
  offset = _integers(u[1], 1, num_classes)
  labels = jnp.where(noisy, (sample.labels + offset) % num_classes, sample.labels)
  return sample._replace(labels=labels, correct=sample.predictions == labels)


def imbalanced(key: jax.Array, *, class0_share: Any = 0.2, model: str = "calibrated",
               minority_p_correct: Any = None, num_samples: int = PAPER_NUM_SAMPLES,
               num_classes: int = PAPER_NUM_CLASSES, **overrides: Any) -> SyntheticPredictions:
  """A paper model on imbalanced labels: class 0 takes exactly floor(share * n) samples.

  The other labels are uniform over classes 1..K-1 (the published
  ``stress_imbalance.py``). The prediction rule of ``model`` (default the
  calibrated one, parameters overridable) is applied to these labels with
  :func:`predict`; its random guesses stay uniform over all K classes. That
  rule ignores the class, so imbalance alone changes no metric (as in the
  published script); ``minority_p_correct`` makes the model worse (or better)
  on class 0, the usual situation with a rare class.

  Args:
    key: a JAX PRNG key.
    class0_share: share of class 0, in [0, 1].
    model: one of :data:`MODELS`.
    minority_p_correct: optional ``p_correct`` for class-0 samples (default:
      the model's ``p_correct``).
    num_samples: n >= 1 (static).
    num_classes: K >= 2 (static).
    **overrides: ``p_correct``, ``correct_confidence``, ``wrong_confidence``.

  Returns:
    :class:`SyntheticPredictions` of shape [num_samples].

  Examples:
    >>> import jax
    >>> from cwsa_jax import synthetic
    >>> s = synthetic.imbalanced(jax.random.key(0), class0_share=0.4)
    >>> print(int((s.labels == 0).sum()))
    400
  """
  if model not in PAPER_PARAMETERS:
    raise ValueError(f"model must be one of {MODELS}, got {model!r}")
  num_samples = _check_static_int(num_samples, "num_samples", 1)
  num_classes = _check_static_int(num_classes, "num_classes", 2)
  _check_probability(class0_share, "class0_share")
  params = dict(PAPER_PARAMETERS[model])
  unknown = set(overrides) - set(params)
  if unknown:
    raise ValueError(f"unknown parameter(s): {sorted(unknown)}; expected some of {sorted(params)}")
  params.update(overrides)
  majority = _check_probability(params["p_correct"], "p_correct")
  minority = majority if minority_p_correct is None else _check_probability(
      minority_p_correct, "minority_p_correct")
  low_c, high_c = _check_range(params["correct_confidence"], "correct_confidence")
  low_w, high_w = _check_range(params["wrong_confidence"], "wrong_confidence")
  count = _fraction_count(_as_scalar(class0_share), num_samples)
  return _imbalanced(key, count, majority, minority, low_c, high_c, low_w, high_w,
                     num_samples=num_samples, num_classes=num_classes)


@functools.partial(jax.jit, static_argnames=("num_samples", "num_classes"))
def _imbalanced(key, count, majority, minority, correct_low, correct_high, wrong_low, wrong_high,
                *, num_samples, num_classes):
  u = jax.random.uniform(key, (6, num_samples), jnp.float32)
  labels = jnp.where(_exact_fraction_mask(u[0], count), 0, _integers(u[1], 1, num_classes))
  p_correct = jnp.where(labels == 0, minority, majority)  # a per-sample p_correct
  return _rule(u[2:], labels, p_correct, correct_low, correct_high, wrong_low, wrong_high,
               num_classes)


def with_confidence_shift(sample: SyntheticPredictions, *, shift: Any) -> SyntheticPredictions:
  """Moves every confidence by ``shift`` and clips to [0, 1]: c' = clip(c + shift, 0, 1).

  A positive shift makes the model overconfident, a negative one
  underconfident; predictions and correctness are unchanged. Clipping creates
  ties at 0 and 1.

  Examples:
    >>> import jax
    >>> from cwsa_jax import synthetic
    >>> s = synthetic.calibrated(jax.random.key(0), num_samples=1000)
    >>> shifted = synthetic.with_confidence_shift(s, shift=0.25)
    >>> print(float(shifted.confidences.max()), bool((shifted.correct == s.correct).all()))
    1.0 True
  """
  sample = _check_sample(sample)
  shift = _validation.as_float_array(shift, "shift")
  if shift.ndim != 0:
    raise ValueError(f"shift must be a scalar, got shape {shift.shape}")
  if _validation.is_concrete(shift) and not np.isfinite(float(shift)):
    raise ValueError(f"shift must be finite, got {float(shift)}")
  confidences = jnp.clip(sample.confidences + shift.astype(jnp.float32), 0.0, 1.0)
  return sample._replace(confidences=confidences)


def to_probs(sample: SyntheticPredictions, *, num_classes: int = PAPER_NUM_CLASSES) -> jax.Array:
  """A probability matrix whose top label and top probability are the sample's.

  The predicted class gets probability c_i and the other K - 1 classes share
  1 - c_i equally, so ``confidences_from_probs(to_probs(s), s.labels)`` gives
  back ``(s.confidences, s.correct)``. This needs c_i > 1/K (otherwise the
  predicted class would not be the arg-max); concrete inputs with a smaller
  confidence raise ``ValueError`` (the paper's random model has c down to 0.3
  < 1/3).

  Args:
    sample: :class:`SyntheticPredictions` with fields [..., n].
    num_classes: K >= 2 (static).

  Returns:
    float32 [..., n, K] probabilities (rows sum to 1).

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax import synthetic
    >>> s = synthetic.SyntheticPredictions(jnp.array([0]), jnp.array([2]), jnp.array([0.6]), jnp.array([False]))
    >>> print([[round(float(p), 4) for p in row] for row in synthetic.to_probs(s)])
    [[0.2, 0.2, 0.6]]
  """
  sample = _check_sample(sample)
  num_classes = _check_static_int(num_classes, "num_classes", 2)
  c = sample.confidences.astype(jnp.float32)
  if _validation.is_concrete(c):
    v = np.asarray(c)
    if v.size and v.min() <= 1.0 / num_classes:
      raise ValueError(
          f"to_probs needs confidences > 1/num_classes = {1.0 / num_classes:.4g} (a smaller maximum "
          f"probability is impossible), got a minimum of {v.min():.4g}")
  rest = (1.0 - c) / (num_classes - 1)
  one_hot = jax.nn.one_hot(sample.predictions, num_classes, dtype=jnp.bool_)
  return jnp.where(one_hot, c[..., None], rest[..., None])
