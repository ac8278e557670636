"""Surrogate losses built on the soft CWSA (optax style).

Pure functions of ``logits`` [..., n, K] and integer ``labels`` [..., n] with
keyword-only options. Unlike optax's per-example losses, these return one
scalar per batch: CWSA is a statistic of a *set* of predictions (a weighted
mean over the retained samples), so the batch is the unit.

Beside them: :func:`focal_loss` and :func:`inverse_focal_loss` (reweighted
cross-entropies, averaged over the samples axis) and the soft AURC
(:func:`soft_aurc_loss`, :func:`soft_aurc_regularized_loss`), a batch
statistic like the soft CWSA.

**How correctness enters the gradient.** The confidence c_i is the max-softmax
probability; the correctness kappa_i can be

* ``"probability"`` (default): kappa_i = p_{i, y_i}, the true-class
  probability. For a correct prediction p_y = c, so the sample scores
  phi(c)(2c - 1); for a wrong one p_y < c. The gradient moves the confidence
  *and* moves probability mass to the true class, so the regulariser pulls in
  the same direction as the cross-entropy.
* ``"hard"``: kappa_i = stop_gradient(1[argmax_i = y_i]). The gradient flows
  through the confidences only: up for correct predictions, down for wrong
  ones; which class wins is left to the cross-entropy.

``python benchmarks/correctness_choice.py`` compares the two on a linear
softmax classifier and a small MLP trained on a synthetic Gaussian mixture
with label noise (paired over seeds against plain cross-entropy, hard metrics
on a test split). ``"probability"`` gave the larger CWSA gain in every
configuration tried, at the same accuracy, so it is the default; at
``tau=0.5`` neither moves AURC much (they shift confidences around the
threshold rather than rank better). With a high target threshold
(``tau=0.9``) both cost accuracy and AURC, and CWSA at 0.5 falls: prefer
tau = 0.5 (or a band starting there) with a modest weight.

**Masks (padded batches).** Every loss takes ``mask=`` as ``nnx.metrics``
and optax's ``where=`` do: a bool, integer or float array broadcastable to
``labels.shape`` ([..., n]); a nonzero entry keeps its sample, 0 drops it (a
float mask is not a weight: 0.5 keeps the sample whole). With M = {i : m_i != 0}
the kept samples, a masked loss is the loss of the kept samples alone (up to
float rounding of its sums): means run over M, the soft CWSA's gated sums over
M (a dropped sample's gate is 0), and the soft AURC ranks within M, with n the
number of kept samples. A batch row with no kept sample has loss 0 and
gradient 0, so a padding-only step changes nothing. Dropped samples' logits get a gradient of exactly 0, and
any finite values there give finite values and gradients (they are replaced by
zeros before the softmax). Inputs are still checked in full: NaN/inf logits or
labels out of range raise even in dropped rows (concrete), or make the batch's
loss NaN (traced), as does a NaN or infinite mask entry.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from cwsa_jax import _public
from cwsa_jax import _soft
from cwsa_jax import _validation

CORRECTNESS = ("hard", "probability")


def _prepare(logits: Any, labels: Any, mask: Any = None
             ) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array | None]:
  """(logits, int32 labels, mask or None, traced batch-row flag [...] or None).

  Without a mask, traced invalid samples poison the logits (so the batch's loss is
  NaN) and the flag is None; with one, the flag covers dropped samples too and
  the caller poisons the loss (:func:`_validation.poison`).
  """
  logits = _validation.as_float_array(logits, "logits")
  if logits.ndim < 2:
    raise ValueError(f"logits must have shape [..., n, num_classes], got {logits.shape}")
  if logits.shape[-1] < 2:
    raise ValueError(f"logits need at least 2 classes, got shape {logits.shape}")
  labels, label_flag = _validation.labels(labels, logits.shape[-1])
  if labels.shape != logits.shape[:-1]:
    raise ValueError(
        f"labels must have shape logits.shape[:-1] = {logits.shape[:-1]}, got {labels.shape}")
  if logits.shape[-2] == 0:
    raise ValueError("logits is empty: at least one sample is needed")
  finite_flag = _validation.check_finite_in_unit_interval(logits, "logits", unit=False)
  # Traced invalid samples (NaN/inf logits, labels out of range) get NaN logits:
  # their batch's loss, and its gradient, are NaN.
  flag = _validation.either(finite_flag, label_flag)
  if mask is None:
    if flag is not None:
      logits = _validation.poison(logits, rows=flag)
      labels = jnp.where(flag, 0, labels)
    return logits, labels, None, None
  mask, mask_flag = _validation.mask(mask, labels.shape)
  # The kernels drop masked samples' values, so an invalid one there would not reach
  # the loss: the flag marks the whole batch row instead.
  flag = _validation.either(flag, mask_flag)
  rows = None
  if flag is not None:
    flag = jnp.broadcast_to(flag, labels.shape)
    labels = jnp.where(flag, 0, labels)
    rows = jnp.any(flag, axis=-1)
  return logits, labels, mask, rows


def _keep_and_log_probs(logits: jax.Array, labels: jax.Array, mask: jax.Array | None):
  """(bool kept samples [..., n] or None, log-softmax [..., n, K]) in at least float32."""
  dtype = jnp.promote_types(logits.dtype, jnp.float32)
  logits = logits.astype(dtype)
  keep = None
  if mask is not None:
    keep = jnp.broadcast_to(mask != 0, labels.shape)
    # Dropped rows become zeros: whatever finite values they held, nothing large
    # reaches exp, and the where gives their logits a gradient of exactly 0.
    logits = jnp.where(keep[..., None], logits, jnp.zeros((), dtype))
  return keep, jax.nn.log_softmax(logits, axis=-1)


def _mean(x: jax.Array, keep: jax.Array | None) -> jax.Array:
  """Mean over the samples axis; with ``keep``, over the kept samples (0 when none is)."""
  if keep is None:
    return jnp.mean(x, axis=-1)
  count = jnp.sum(keep, axis=-1).astype(x.dtype)
  return jnp.sum(x, axis=-1, where=keep) / jnp.maximum(count, 1.0)


def _empty_to_zero(loss: jax.Array, keep: jax.Array | None) -> jax.Array:
  """``loss`` with 0 (and a zero gradient) for the batch rows that keep no sample."""
  return loss if keep is None else jnp.where(jnp.any(keep, axis=-1), loss, 0.0)


def _confidence_and_correct(log_probs: jax.Array, labels: jax.Array, correctness: str):
  """Max-softmax confidence, correctness kappa and the true-class log-probability."""
  true_log_prob = jnp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
  confidences = jnp.exp(jnp.max(log_probs, axis=-1))
  if correctness == "hard":
    predicted = jnp.argmax(log_probs, axis=-1)
    correct = jax.lax.stop_gradient((predicted == labels).astype(log_probs.dtype))
  else:
    correct = jnp.exp(true_log_prob)
  return confidences, correct, true_log_prob


def _as_band(band: Any) -> tuple[float, float] | None:
  """A hashable (static) band."""
  return None if band is None else (float(band[0]), float(band[1]))


def _check_options(correctness: str, band: Any, num_thresholds: int) -> None:
  if correctness not in CORRECTNESS:
    raise ValueError(f"correctness must be one of {CORRECTNESS}, got {correctness!r}")
  if band is not None:
    _soft._check_band(band, num_thresholds)


@functools.partial(jax.jit, static_argnames=("correctness", "band", "num_thresholds", "plus"))
def _loss_terms(logits, labels, mask, tau, temperature, *, correctness, band, num_thresholds,
                plus):
  """(mean cross-entropy, 1 - soft CWSA), each of shape [...] (both 0 where nothing is kept)."""
  keep, log_probs = _keep_and_log_probs(logits, labels, mask)
  dtype = log_probs.dtype
  confidences, correct, true_log_prob = _confidence_and_correct(log_probs, labels, correctness)
  cross_entropy = -_mean(true_log_prob, keep)
  soft = _soft_term(confidences, correct, keep, tau=tau.astype(dtype),
                    temperature=temperature.astype(dtype), band=band,
                    num_thresholds=num_thresholds, plus=plus)
  return cross_entropy, _empty_to_zero(1.0 - soft, keep)


def _soft_term(confidences, correct, keep, *, tau, temperature, band, num_thresholds, plus):
  """Soft CWSA (or CWSA+) at tau, or its band average over ``band``."""
  if band is None:
    return _soft._soft_metric(confidences, correct, tau, temperature, keep, plus=plus,
                              normalize="retained")
  thresholds = jnp.asarray(_soft.band_thresholds(band, num_thresholds))
  values = _soft._sweep(confidences, correct, thresholds, temperature, keep, plus=plus,
                        normalize="retained")
  # Trapezoid over an equally spaced grid, divided by the band width.
  return (jnp.sum(values, -1) - 0.5 * (values[..., 0] + values[..., -1])) / (num_thresholds - 1)


@_public.float_entry
def cwsa_surrogate_loss(logits: Any, labels: Any, *, tau: Any = 0.5, temperature: Any = 0.05,
                        correctness: str = "probability", band: tuple[float, float] | None = None,
                        num_thresholds: int = _soft.DEFAULT_BAND_THRESHOLDS,
                        plus: bool = False, mask: Any = None) -> jax.Array:
  """One minus the soft CWSA of the max-softmax confidences.

  .. math::

    \\ell = 1 - \\mathrm{softCWSA}_T\\bigl(c, \\kappa; \\tau\\bigr), \\qquad
    c_i = \\max_k \\mathrm{softmax}(z_i)_k,

  with kappa as chosen by ``correctness`` (see the module docstring). With
  ``band=(low, high)`` the soft CWSA at tau is replaced by its trapezoid
  average over ``num_thresholds`` thresholds in the band
  (:func:`cwsa_jax._soft.soft_cwsa_band_area`). The loss lies in [0, 2]
  ([0, 1] with ``plus=True``, which uses CWSA+ and never penalises errors).

  With ``mask`` m, only the kept samples M = {i : m_i != 0} enter the gated
  sums (a dropped sample's gate is 0):

  .. math::

    \\mathrm{softCWSA}_T = \\frac{\\sum_{i \\in M} g_i\\,\\phi^+_i\\,(2\\kappa_i - 1)}
      {\\sum_{i \\in M} g_i},

  the value on the kept samples alone; the loss is 0 (gradient 0) when M is
  empty (see the module docstring).

  **Alone it does not train a fresh model.** The weight phi^+ is clipped at 0
  below tau, so while every confidence of the batch is below tau (or below the
  band) the loss is exactly 1 and its gradient exactly 0: a freshly initialised
  10-class model (confidences near 0.1) never leaves that point. Train with
  :func:`cwsa_regularized_loss` (cross-entropy plus this term), which moves the
  confidences up until some cross tau, or start from a trained model.

  Args:
    logits: [..., n, K] unnormalised scores; leading axes are batch axes
      (one loss each).
    labels: [..., n] integer labels in [0, K).
    tau: threshold in [0, 1) (ignored when ``band`` is given).
    temperature: T > 0 of the sigmoid gate (may be traced, e.g. scheduled).
    correctness: ``"probability"`` (true-class probability, default) or
      ``"hard"`` (stop-gradient 0/1 correctness).
    band: optional (low, high) threshold band, 0 <= low < high < 1.
    num_thresholds: grid size for ``band`` (>= 2).
    plus: use soft CWSA+ instead of soft CWSA.
    mask: optional bool, integer or float array broadcastable to
      ``labels.shape``; nonzero keeps a sample, 0 drops it (padding).

  Returns:
    [...] loss (a scalar for [n, K] logits).

  Raises:
    ValueError: on concrete NaN/inf logits (dropped rows included), labels
      out of range or of the wrong shape, tau outside [0, 1), temperature
      <= 0, a bad option, or a mask that does not broadcast to
      ``labels.shape`` or holds NaN/inf. Inside a user's ``jit`` / ``vmap``
      such values give a NaN loss (and NaN gradients) instead.
    TypeError: a mask that is not boolean, integer or float (also a
      ValueError).

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax.losses import cwsa_surrogate_loss
    >>> logits = jnp.array([[4.0, 0.0, 0.0], [0.0, 3.0, 0.0], [1.0, 1.2, 0.0]])
    >>> print(round(float(cwsa_surrogate_loss(logits, jnp.array([0, 1, 0]))), 4))
    0.3505

    A padded batch: the masked loss is the loss of the kept samples.

    >>> padded = jnp.concatenate([logits, jnp.full((2, 3), 7.0)])
    >>> keep = jnp.array([True, True, True, False, False])
    >>> loss = cwsa_surrogate_loss(padded, jnp.array([0, 1, 0, 0, 0]), mask=keep)
    >>> print(round(float(loss), 4))
    0.3505
  """
  _check_options(correctness, band, num_thresholds)
  logits, labels, mask, rows = _prepare(logits, labels, mask)
  tau = _soft._prepare_tau(tau)
  temperature = _soft._check_temperature(temperature)
  _, surrogate = _loss_terms(logits, labels, mask, tau, temperature, correctness=correctness,
                             band=_as_band(band), num_thresholds=num_thresholds, plus=plus)
  return _validation.poison(surrogate, rows=rows)


@_public.float_entry
def cwsa_regularized_loss(logits: Any, labels: Any, *, weight: Any = 1.0, tau: Any = 0.5,
                          temperature: Any = 0.05, correctness: str = "probability",
                          band: tuple[float, float] | None = None,
                          num_thresholds: int = _soft.DEFAULT_BAND_THRESHOLDS,
                          plus: bool = False, mask: Any = None) -> jax.Array:
  """Mean cross-entropy plus ``weight`` x (1 - soft CWSA of the max-softmax confidence).

  .. math::

    \\ell = -\\frac{1}{n}\\sum_i \\log \\mathrm{softmax}(z_i)_{y_i}
      + w\\,\\bigl(1 - \\mathrm{softCWSA}_T(c, \\kappa; \\tau)\\bigr),
    \\qquad c_i = \\max_k \\mathrm{softmax}(z_i)_k.

  The soft CWSA is :func:`cwsa_jax._soft.soft_cwsa` (sigmoid gate of
  temperature T, smoothly clipped phi, g-weighted mean over the batch);
  kappa is the true-class probability by default (see the module docstring
  for the experiment behind that choice). Everything is computed
  from ``log_softmax``, so logits of any finite magnitude give finite values
  and gradients.

  With ``mask`` m and M = {i : m_i != 0}, both terms are those of the kept
  samples alone:

  .. math::

    \\ell = -\\frac{1}{|M|}\\sum_{i \\in M} \\log \\mathrm{softmax}(z_i)_{y_i}
      + w\\,\\bigl(1 - \\mathrm{softCWSA}_T(c_M, \\kappa_M; \\tau)\\bigr),

  and 0 (gradient 0) when M is empty.

  Args:
    weight: w >= 0, the regulariser's weight (0 gives plain cross-entropy; may
      be traced).
    logits, labels, tau, temperature, correctness, band, num_thresholds, plus, mask:
      as :func:`cwsa_surrogate_loss`.

  Returns:
    [...] loss (a scalar for [n, K] logits).

  Raises:
    ValueError: as :func:`cwsa_surrogate_loss`, or weight negative or not
      finite.

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax.losses import cwsa_regularized_loss
    >>> logits = jnp.array([[4.0, 0.0, 0.0], [0.0, 3.0, 0.0], [1.0, 1.2, 0.0]])
    >>> labels = jnp.array([0, 1, 0])
    >>> print(round(float(cwsa_regularized_loss(logits, labels)), 4))
    0.7113
    >>> print(round(float(cwsa_regularized_loss(logits, labels, weight=0.0)), 4))
    0.3608
  """
  _check_options(correctness, band, num_thresholds)
  logits, labels, mask, rows = _prepare(logits, labels, mask)
  tau = _soft._prepare_tau(tau)
  temperature = _soft._check_temperature(temperature)
  weight = _nonnegative_scalar(weight, "weight")
  cross_entropy, surrogate = _loss_terms(
      logits, labels, mask, tau, temperature, correctness=correctness, band=_as_band(band),
      num_thresholds=num_thresholds, plus=plus)
  return _validation.poison(cross_entropy + weight.astype(cross_entropy.dtype) * surrogate,
                            rows=rows)


# ---------------------------------------------------------------------------
# Reweighted cross-entropies and the soft AURC (Zhou et al., 2025).


def _nonnegative_scalar(x: Any, name: str) -> jax.Array:
  """A scalar option >= 0 (``gamma``, ``weight``) as a float array."""
  x = _validation.as_float_array(x, name)
  if x.ndim != 0:
    raise ValueError(f"{name} must be a scalar, got shape {x.shape}")
  # Concrete: checked; traced and negative or not finite: NaN (so is the loss).
  return _validation.nan_if_invalid(x, _validation.check_nonnegative(x, name))


@functools.partial(jax.jit, static_argnames=("inverse",))
def _focal(logits, labels, mask, gamma, *, inverse):
  """Mean (inverse) focal loss over the (kept) samples, [...]."""
  keep, log_probs = _keep_and_log_probs(logits, labels, mask)
  dtype = log_probs.dtype
  true_log_prob = jnp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
  if inverse:
    log_base = jnp.log1p(jnp.exp(true_log_prob))  # log(1 + p_y)
  else:
    # log(1 - p_y) as the log-sum of the other classes' probabilities: finite
    # (with finite gradients) even where p_y rounds to 1, as at logits ~1e4.
    others = labels[..., None] != jnp.arange(log_probs.shape[-1])
    log_base = jax.nn.logsumexp(log_probs, axis=-1, where=others)
  # base^gamma as exp(gamma log base): exactly 1 at gamma = 0, and no
  # 0^(gamma - 1) in the gradient when base = 0.
  sample_weight = jnp.exp(gamma.astype(dtype) * log_base)
  return -_mean(sample_weight * true_log_prob, keep)


@_public.float_entry
def focal_loss(logits: Any, labels: Any, *, gamma: Any, mask: Any = None) -> jax.Array:
  """Mean focal loss: cross-entropy down-weighted on well-classified samples.

  .. math::

    \\ell = -\\frac{1}{n}\\sum_i (1 - p_{i y_i})^{\\gamma} \\log p_{i y_i},
    \\qquad p_i = \\mathrm{softmax}(z_i).

  At gamma = 0 this is the mean cross-entropy. The gradient flows through
  the weight too (as in Lin et al.; nothing is detached). The weight is
  computed as exp(gamma log(1 - p_y)) with log(1 - p_y) the log-sum-exp of
  the other classes' log-probabilities, so values and gradients are finite
  for logits of any finite magnitude, including p_y = 1 in float32.

  With ``mask`` m, the mean runs over the kept samples M = {i : m_i != 0}:

  .. math::

    \\ell = -\\frac{1}{|M|}\\sum_{i \\in M} (1 - p_{i y_i})^{\\gamma} \\log p_{i y_i},

  and the loss is 0 (gradient 0) when M is empty.

  Args:
    logits: [..., n, K] unnormalised scores; leading axes are batch axes.
    labels: [..., n] integer labels in [0, K).
    gamma: scalar gamma >= 0 (may be traced).
    mask: optional bool, integer or float array broadcastable to
      ``labels.shape``; nonzero keeps a sample, 0 drops it (see the module
      docstring).

  Returns:
    [...] loss (a scalar for [n, K] logits).

  Raises:
    ValueError: on concrete NaN/inf logits (dropped rows included), bad
      labels or shapes, gamma negative or not finite, or a mask that does not
      broadcast to ``labels.shape`` or holds NaN/inf. Inside a user's
      ``jit`` / ``vmap`` such values give a NaN loss instead.
    TypeError: a mask that is not boolean, integer or float (also a
      ValueError).

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax.losses import focal_loss
    >>> logits, labels = jnp.array([[2.0, 0.0], [0.0, 1.0]]), jnp.array([0, 0])
    >>> print(round(float(focal_loss(logits, labels, gamma=0.0)), 4))  # cross-entropy
    0.7201
    >>> print(round(float(focal_loss(logits, labels, gamma=2.0)), 4))
    0.3518

  References:
    Lin, Goyal, Girshick, He & Dollar, "Focal loss for dense object
    detection", ICCV 2017.
    Mukhoti et al., "Calibrating deep neural networks using focal loss",
    NeurIPS 2020.
  """
  logits, labels, mask, rows = _prepare(logits, labels, mask)
  loss = _focal(logits, labels, mask, _nonnegative_scalar(gamma, "gamma"), inverse=False)
  return _validation.poison(loss, rows=rows)


@_public.float_entry
def inverse_focal_loss(logits: Any, labels: Any, *, gamma: Any, mask: Any = None) -> jax.Array:
  """Mean inverse focal loss: cross-entropy up-weighted on well-classified samples.

  .. math::

    \\ell = -\\frac{1}{n}\\sum_i (1 + p_{i y_i})^{\\gamma} \\log p_{i y_i},
    \\qquad p_i = \\mathrm{softmax}(z_i).

  At gamma = 0 this is the mean cross-entropy; the weight lies in
  [1, 2^gamma] and, unlike the focal loss's, grows with p_y. This is the
  definition of Zhou et al. (2025) (their ``InverseFocalLoss``; the gradient
  flows through the weight), who relate its weighting to that of a
  regularised AURC.

  With ``mask`` m, the mean runs over the kept samples M = {i : m_i != 0}
  (0, gradient 0, when M is empty):

  .. math::

    \\ell = -\\frac{1}{|M|}\\sum_{i \\in M} (1 + p_{i y_i})^{\\gamma} \\log p_{i y_i}.

  Args, Returns and Raises are those of :func:`focal_loss`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax.losses import inverse_focal_loss
    >>> logits, labels = jnp.array([[2.0, 0.0], [0.0, 1.0]]), jnp.array([0, 0])
    >>> print(round(float(inverse_focal_loss(logits, labels, gamma=2.0)), 4))
    1.2818

  References:
    Wang, Feng & Zhang, "Rethinking calibration of deep neural networks: do
    not be afraid of overconfidence", NeurIPS 2021.
    Zhou, Gruber, Popordanoska & Blaschko, "Revisiting reweighted risk for
    calibration: AURC, focal loss, and inverse focal loss", arXiv:2505.23463,
    2025.
  """
  logits, labels, mask, rows = _prepare(logits, labels, mask)
  loss = _focal(logits, labels, mask, _nonnegative_scalar(gamma, "gamma"), inverse=True)
  return _validation.poison(loss, rows=rows)


def _soft_aurc(confidences: jax.Array, errors: jax.Array, temperature: jax.Array,
               keep: jax.Array | None = None) -> jax.Array:
  """Soft AURC [...] of confidences and errors [..., n] (see soft_aurc_loss); with
  ``keep``, of the kept samples alone (0 when none is kept)."""
  n = confidences.shape[-1]
  # An invalid traced T arrives as NaN (_soft._check_temperature): the loss and its
  # gradient are then NaN, never a plausible number.
  # [..., i, j]: sigmoid((c_j - c_i)/T), the soft indicator "j is more confident than i".
  ahead = jax.nn.sigmoid((confidences[..., None, :] - confidences[..., :, None]) / temperature)
  if keep is None:
    # The diagonal adds sigmoid(0) = 1/2, so this is 1 + the soft number of others ahead.
    rank = 0.5 + jnp.sum(ahead, axis=-1)
    harmonic_weight = jax.scipy.special.digamma(n + 1.0) - jax.scipy.special.digamma(rank)
    return jnp.mean(errors * harmonic_weight, axis=-1)
  # Only kept samples j count as ahead; a dropped i gets a rank >= 1/2 (a finite digamma).
  rank = 0.5 + jnp.sum(ahead, axis=-1, where=keep[..., None, :])
  count = jnp.sum(keep, axis=-1, keepdims=True).astype(confidences.dtype)
  harmonic_weight = jax.scipy.special.digamma(count + 1.0) - jax.scipy.special.digamma(rank)
  return _mean(errors * harmonic_weight, keep)


@functools.partial(jax.jit, static_argnames=("correctness",))
def _aurc_terms(logits, labels, mask, temperature, *, correctness):
  """(mean cross-entropy, soft AURC), each of shape [...] (both 0 where nothing is kept)."""
  keep, log_probs = _keep_and_log_probs(logits, labels, mask)
  dtype = log_probs.dtype
  confidences, correct, true_log_prob = _confidence_and_correct(log_probs, labels, correctness)
  cross_entropy = -_mean(true_log_prob, keep)
  return cross_entropy, _soft_aurc(confidences, 1.0 - correct, temperature.astype(dtype), keep)


@_public.float_entry
def soft_aurc_loss(logits: Any, labels: Any, *, temperature: Any = 0.01,
                   correctness: str = "probability", mask: Any = None) -> jax.Array:
  """Soft AURC of the max-softmax confidence: sigmoid-relaxed ranks in the exact AURC.

  Without ties, the step AURC (:func:`cwsa_jax.aurc`) is a rank-weighted mean
  of the errors: sorting by decreasing confidence, the sample at rank r
  (1 = most confident) is counted in the risks E_k/k of every k >= r, so

  .. math::

    \\mathrm{AURC} = \\frac{1}{n}\\sum_{k=1}^{n} \\frac{1}{k}\\sum_{r \\le k} e_{(r)}
      = \\frac{1}{n}\\sum_i e_i \\bigl(\\psi(n + 1) - \\psi(r_i)\\bigr),
    \\qquad \\psi(n + 1) - \\psi(r) = \\sum_{k=r}^{n} \\frac{1}{k}.

  The soft AURC replaces each rank by the sigmoid-relaxed rank

  .. math::

    \\tilde r_i = 1 + \\sum_{j \\ne i} \\sigma\\Bigl(\\frac{c_j - c_i}{T}\\Bigr),
    \\qquad c_i = \\max_k \\mathrm{softmax}(z_i)_k,

  and the weight by the digamma function at the real rank. The relaxed ranks
  always sum to n(n + 1)/2 and form a point of the permutahedron, so (the
  weight being convex in r) the soft AURC lies in [0, 1] like the hard one.
  As T -> 0, r~_i tends to the exact rank wherever no two confidences tie,
  and with ``correctness="hard"`` the soft AURC tends to the step AURC of
  the batch (tied confidences get their mid-rank instead of the step
  convention's tie grouping). The errors are

  * ``"probability"`` (default): e_i = 1 - p_{i, y_i}, so the gradient also
    moves probability mass to the true class;
  * ``"hard"``: e_i = stop_gradient(1[argmax_i != y_i]); the gradient flows
    through the ranks (the confidences) only.

  Cost: O(n^2) time and memory per batch (an [n, n] matrix of pairwise
  sigmoids), fine for training batches of a few thousand. Zhou et al. (2025)
  optimise a regularised AURC with a SoftRank (fast-soft-sort) relaxation and
  the cross-entropy as the per-sample loss; the pairwise sigmoid relaxation
  here keeps the exact AURC as its T -> 0 limit.

  With ``mask`` m, the batch is the kept samples M = {i : m_i != 0}: ranks
  among them only, and n their number,

  .. math::

    \\tilde r_i = 1 + \\sum_{j \\in M,\\, j \\ne i} \\sigma\\Bigl(\\frac{c_j - c_i}{T}\\Bigr),
    \\qquad
    \\mathrm{softAURC} = \\frac{1}{|M|}\\sum_{i \\in M} e_i
      \\bigl(\\psi(|M| + 1) - \\psi(\\tilde r_i)\\bigr),

  and 0 (gradient 0) when M is empty.

  Args:
    logits: [..., n, K] unnormalised scores; leading axes are batch axes.
    labels: [..., n] integer labels in [0, K).
    temperature: T > 0 of the pairwise sigmoids, in confidence units
      (default 0.01; may be traced).
    correctness: ``"probability"`` (default) or ``"hard"``.
    mask: optional bool, integer or float array broadcastable to
      ``labels.shape``; nonzero keeps a sample, 0 drops it (see the module
      docstring).

  Returns:
    [...] soft AURC in [0, 1] (a scalar for [n, K] logits); lower is better.

  Raises:
    ValueError: on concrete NaN/inf logits (dropped rows included), bad
      labels or shapes, temperature <= 0 or not finite, an unknown
      ``correctness``, or a mask that does not broadcast to ``labels.shape``
      or holds NaN/inf. Inside a user's ``jit`` / ``vmap`` such values give a
      NaN loss (and NaN gradients).
    TypeError: a mask that is not boolean, integer or float (also a
      ValueError).

  Examples:
    >>> import jax.numpy as jnp
    >>> import cwsa_jax as cw
    >>> from cwsa_jax.losses import soft_aurc_loss
    >>> logits = jnp.array([[4.0, 0.0, 0.0], [0.0, 3.0, 0.0], [1.0, 1.2, 0.0]])
    >>> labels = jnp.array([0, 1, 0])
    >>> soft = soft_aurc_loss(logits, labels, temperature=1e-4, correctness="hard")
    >>> hard = cw.aurc(*cw.confidences_from_logits(logits, labels))
    >>> print(round(float(soft), 4), round(float(hard), 4))
    0.1111 0.1111
    >>> print(round(float(soft_aurc_loss(logits, labels)), 4))
    0.1149

  References:
    Geifman, Uziel & El-Yaniv, "Bias-reduced uncertainty estimation for deep
    neural classifiers", ICLR 2019 (AURC, E-AURC).
    Zhou, Gruber, Popordanoska & Blaschko, "Revisiting reweighted risk for
    calibration: AURC, focal loss, and inverse focal loss", arXiv:2505.23463,
    2025.
  """
  _check_options(correctness, None, _soft.DEFAULT_BAND_THRESHOLDS)
  logits, labels, mask, rows = _prepare(logits, labels, mask)
  temperature = _soft._check_temperature(temperature)
  _, soft = _aurc_terms(logits, labels, mask, temperature, correctness=correctness)
  return _validation.poison(soft, rows=rows)


@_public.float_entry
def soft_aurc_regularized_loss(logits: Any, labels: Any, *, weight: Any = 1.0,
                               temperature: Any = 0.01,
                               correctness: str = "probability", mask: Any = None) -> jax.Array:
  """Mean cross-entropy plus ``weight`` x the soft AURC of the max-softmax confidence.

  .. math::

    \\ell = -\\frac{1}{n}\\sum_i \\log \\mathrm{softmax}(z_i)_{y_i}
      + w\\,\\mathrm{softAURC}_T(c, e),

  with the soft AURC of :func:`soft_aurc_loss` (errors e chosen by
  ``correctness``). Zhou et al. (2025) minimise (1 - w) CE + w x (a
  rank-weighted CE); here the regulariser is the soft AURC itself, in the
  shape of :func:`cwsa_regularized_loss`.

  With ``mask`` m and M = {i : m_i != 0}, both terms are those of the kept
  samples alone (0, gradient 0, when M is empty):

  .. math::

    \\ell = -\\frac{1}{|M|}\\sum_{i \\in M} \\log \\mathrm{softmax}(z_i)_{y_i}
      + w\\,\\mathrm{softAURC}_T(c_M, e_M).

  Args:
    weight: w >= 0 (0 gives plain cross-entropy; may be traced).
    logits, labels, temperature, correctness, mask: as :func:`soft_aurc_loss`.

  Returns:
    [...] loss (a scalar for [n, K] logits).

  Raises:
    ValueError: as :func:`soft_aurc_loss`, or weight negative or not finite.

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax.losses import soft_aurc_regularized_loss
    >>> logits = jnp.array([[4.0, 0.0, 0.0], [0.0, 3.0, 0.0], [1.0, 1.2, 0.0]])
    >>> labels = jnp.array([0, 1, 0])
    >>> print(round(float(soft_aurc_regularized_loss(logits, labels, weight=0.0)), 4))
    0.3608
  """
  _check_options(correctness, None, _soft.DEFAULT_BAND_THRESHOLDS)
  logits, labels, mask, rows = _prepare(logits, labels, mask)
  temperature = _soft._check_temperature(temperature)
  weight = _nonnegative_scalar(weight, "weight")
  cross_entropy, soft = _aurc_terms(logits, labels, mask, temperature, correctness=correctness)
  return _validation.poison(cross_entropy + weight.astype(cross_entropy.dtype) * soft, rows=rows)
