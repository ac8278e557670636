"""Soft (differentiable) CWSA and CWSA+: the threshold gate relaxed to a sigmoid.

The hard metrics retain S = {i : c_i >= tau} and weight each retained sample
by phi_i = (c_i - tau)/(1 - tau). Their gradient with respect to the
confidences is zero almost everywhere: the gate 1[c >= tau] is a step. Here,
with a temperature T > 0 and z_i = (c_i - tau)/T,

.. math::

  g_i = \\sigma(z_i), \\qquad
  \\phi^+_i = \\frac{\\max(c_i - \\tau, 0)}{1 - \\tau},

  \\mathrm{softCWSA} = \\frac{\\sum_i g_i\\,\\phi^+_i\\,(2\\kappa_i - 1)}{\\sum_i g_i},
  \\qquad
  \\mathrm{softCWSA}^+ = \\frac{\\sum_i g_i\\,\\phi^+_i\\,\\kappa_i}{\\sum_i g_i}.

**phi below tau is clipped at 0.** Only the gate is relaxed; the weight is the
hard phi above tau and exactly 0 below it. So a sample below tau never
contributes to the numerator, only (through its gate) to the soft count
sum g in the denominator. Consequences: the soft metrics stay in the hard
metrics' ranges ([-1, 1] and [0, 1]) at every temperature; nothing retained
gives exactly 0, like the hard metric; as T -> 0 the gates converge to the
indicator wherever no confidence equals tau, so the soft metrics converge to
the hard ones (at T = 1e-4 a confidence 0.02 away from tau has a gate within
e^-200 of 0 or 1); as T -> infinity every gate tends to 1/2 and soft CWSA
tends to the ``normalize="all"`` variant (sum over S divided by n). A smooth
clip (``T * softplus(z)``) was tried and rejected: it exceeds 1 by up to
T log 2/(1 - tau), which is unbounded for large T or tau near 1. The clip
has a kink at c = tau, where the gradient of phi jumps from 0 to
1/(1 - tau) (JAX uses 0 at the kink); the metric is differentiable
everywhere else.

**Numerics.** The g-weighted mean is computed as ``softmax(log_sigmoid(z))``,
i.e. g_i / sum g in log space. This is the stable form of the safe division:
the naive ratio needs the double-``where`` trick when every gate underflows
(nothing retained, tiny T), and even then gives inf gradients while sum g is
subnormal; the log-space form has no division by sum g at all. The only
divisions left are by T and by 1 - tau. No value is NaN or infinite, nor is
any gradient, for confidences exactly at tau or at 1, nothing retained, and
temperatures from 1e-6 to 1e6.

**Invalid values.** Concrete NaN/inf or out-of-range confidences or
correctness, tau outside [0, 1) or a temperature that is not finite and > 0
raise ``ValueError``; inside a user's ``jit`` / ``vmap`` they give NaN (and
NaN gradients), never a plausible number.

**Gradients** are those of the relaxation itself, exact (autodiff of the
formula above): "relaxed" gradients of the hard metric.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cwsa_jax import _public
from cwsa_jax import _validation

NORMALIZATIONS = ("retained", "all")
DEFAULT_BAND = (0.5, 0.9)
DEFAULT_BAND_THRESHOLDS = 9


def _kernel(confidences: jax.Array, correct: jax.Array, tau: jax.Array,
            temperature: jax.Array, keep: jax.Array | None, plus: bool,
            normalize: str) -> jax.Array:
  """Soft CWSA (or CWSA+) of 1-D [n] inputs at one scalar threshold.

  ``keep`` (bool [n] or None): the sums run over the kept samples only, so the
  value is that of the kept samples alone (0 when none is kept).
  """
  # Invalid T or tau (possible only when traced) are handled by the caller,
  # which makes the result NaN (``_validation.poison``).
  z = (confidences - tau) / temperature
  weight = jax.nn.relu(confidences - tau) / (1.0 - tau)  # phi clipped at 0
  score = correct if plus else 2.0 * correct - 1.0
  if normalize == "retained":
    if keep is None:
      gates = jax.nn.softmax(jax.nn.log_sigmoid(z))  # g_i / sum_j g_j, stably
    else:
      gates = _masked_softmax(jax.nn.log_sigmoid(z), keep)
    return jnp.sum(gates * weight * score)
  terms = jax.nn.sigmoid(z) * weight * score
  if keep is None:
    return jnp.mean(terms)
  count = jnp.sum(keep).astype(terms.dtype)
  return jnp.sum(terms, where=keep) / jnp.maximum(count, 1.0)


def _masked_softmax(x: jax.Array, keep: jax.Array) -> jax.Array:
  """softmax of x [n] over the kept entries; 0 at the others, and everywhere when none is kept."""
  # No -inf anywhere: masked entries are replaced before exp (so nothing overflows
  # where the result is discarded), and the shift needs no gradient (shift-invariance).
  shift = jax.lax.stop_gradient(jnp.max(jnp.where(keep, x, jnp.min(x))))
  unnormalized = jnp.where(keep, jnp.exp(jnp.where(keep, x - shift, 0.0)), 0.0)
  total = jnp.sum(unnormalized)  # >= 1 (the kept maximum) unless nothing is kept
  return unnormalized / jnp.where(total > 0, total, 1.0)


def _temperature(temperature: Any) -> tuple[jax.Array, jax.Array | None]:
  """(scalar temperature, traced flag or None): finite and > 0."""
  return _validation.temperature(temperature)


def _check_temperature(temperature: Any) -> jax.Array:
  """The validated scalar temperature: concrete values checked, traced invalid ones made NaN."""
  return _validation.nan_if_invalid(*_temperature(temperature))


def _check_normalize(normalize: str) -> None:
  if normalize not in NORMALIZATIONS:
    raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}")


def _prepare(confidences: Any, correct: Any) -> tuple[jax.Array, jax.Array, jax.Array | None]:
  """(confidences, kappa, row flag or None) in a common float dtype (at least float32)."""
  c = _validation.as_float_array(confidences, "confidences")
  k = _validation.correct_array(correct)
  invalid = _validation.check_samples(c, k)
  dtype = jnp.promote_types(c.dtype, jnp.float32)
  return c.astype(dtype), k.astype(dtype), invalid


def _tau(tau: Any, name: str = "tau") -> tuple[jax.Array, jax.Array | None]:
  """(threshold array, elementwise flag or None): in [0, 1)."""
  tau = _validation.as_float_array(tau, name)
  return tau, _validation.check_threshold(tau, name)


def _prepare_tau(tau: Any, name: str = "tau") -> jax.Array:
  """The validated threshold: concrete values checked, traced invalid ones made NaN."""
  return _validation.nan_if_invalid(*_tau(tau, name))


def _batched(fn, batch_ndim: int, masked: bool = False):
  """vmaps ``fn(confidences, correct, tau, temperature, keep)`` over leading batch axes."""
  for _ in range(batch_ndim):
    fn = jax.vmap(fn, in_axes=(0, 0, None, None, 0 if masked else None))
  return fn


def _soft_metric(confidences, correct, tau, temperature, keep=None, *, plus, normalize):
  """[...] soft metric; ``keep`` (bool [..., n] or None) as in :func:`_kernel`."""
  if tau.ndim != 0:
    raise ValueError(
        f"tau must be a scalar (use soft_cwsa_sweep for several thresholds), got shape {tau.shape}")
  return _soft_metric_jit(confidences, correct, tau, temperature, keep, plus=plus,
                          normalize=normalize)


@functools.partial(jax.jit, static_argnames=("plus", "normalize"))
def _soft_metric_jit(confidences, correct, tau, temperature, keep, *, plus, normalize):
  fn = functools.partial(_kernel, plus=plus, normalize=normalize)
  fn = _batched(fn, confidences.ndim - 1, masked=keep is not None)
  dtype = confidences.dtype
  return fn(confidences, correct, tau.astype(dtype), temperature.astype(dtype), keep)


@_public.float_entry
def soft_cwsa(confidences: Any, correct: Any, tau: Any = 0.5, *, temperature: Any = 0.01,
              normalize: str = "retained") -> jax.Array:
  """Soft CWSA: the sigmoid relaxation of confidence-weighted selective accuracy.

  With gate g_i = sigmoid((c_i - tau)/T) and weight phi^+_i =
  max(c_i - tau, 0)/(1 - tau) (clipped at 0 below tau; see the module
  docstring):

  .. math::

    \\mathrm{softCWSA}_T(\\tau) =
      \\frac{\\sum_i g_i\\,\\phi^+_i\\,(2\\kappa_i - 1)}{\\sum_i g_i}
    \\;\\xrightarrow{T \\to 0}\\;
    \\frac{1}{|S|}\\sum_{i \\in S} \\phi_i\\,(2\\kappa_i - 1).

  It converges to the hard CWSA as T -> 0 wherever no confidence equals tau,
  is exactly 0 when every confidence is below tau, lies in [-1, 1] for every
  T, and is differentiable in confidences, correct and tau (except for the
  kink of the clip at c = tau).

  Args:
    confidences: [..., n] confidences in [0, 1]; leading axes are batch axes
      (the function is also ``jax.vmap``-able).
    correct: [..., n] bool or 0/1 correctness, or real-valued kappa in [0, 1]
      (e.g. the true-class probability, for a gradient through correctness).
    tau: scalar threshold in [0, 1).
    temperature: scalar T > 0, in units of confidence. Small T (1e-4) tracks
      the hard metric; T ~ 0.01-0.1 gives useful gradients in training.
    normalize: ``"retained"`` (default, divide by the soft ``|S| = sum g``, the
      paper's definition) or ``"all"`` (divide by n, as the paper's published
      code does).

  Returns:
    [...] soft CWSA (float32 for float32 inputs).

  Raises:
    ValueError: on concrete inputs with NaN/inf or values outside [0, 1],
      tau outside [0, 1), temperature <= 0, mismatched shapes, no samples or an
      unknown ``normalize``. Inside a user's ``jit`` / ``vmap`` such values
      give NaN instead (a traced temperature <= 0 or tau >= 1 included).

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax import soft_cwsa
    >>> c = jnp.array([0.9, 0.6, 0.8, 0.3])
    >>> ok = jnp.array([True, False, True, True])
    >>> print(round(float(soft_cwsa(c, ok, 0.5, temperature=1e-4)), 4))  # hard: (0.8 - 0.2 + 0.6)/3
    0.4
    >>> print(round(float(soft_cwsa(c, ok, 0.5, temperature=0.05)), 4))
    0.422
  """
  _check_normalize(normalize)
  confidences, correct, rows = _prepare(confidences, correct)
  tau, tau_flag = _tau(tau)
  temperature, t_flag = _temperature(temperature)
  value = _soft_metric(confidences, correct, tau, temperature, plus=False, normalize=normalize)
  return _validation.poison(value, rows=rows, items=_validation.either(tau_flag, t_flag))


@_public.float_entry
def soft_cwsa_plus(confidences: Any, correct: Any, tau: Any = 0.5, *,
                   temperature: Any = 0.01) -> jax.Array:
  """Soft CWSA+: the sigmoid relaxation of CWSA+ (no penalty for errors).

  .. math::

    \\mathrm{softCWSA}^+_T(\\tau) =
      \\frac{\\sum_i g_i\\,\\phi^+_i\\,\\kappa_i}{\\sum_i g_i}
    \\;\\xrightarrow{T \\to 0}\\;
    \\frac{1}{|S|}\\sum_{i \\in S} \\phi_i\\,\\kappa_i,

  with g_i and phi^+_i as in :func:`soft_cwsa` (CWSA+ always divides by the
  soft ``|S|``, as both the paper and its code do).

  Args:
    confidences: [..., n] confidences in [0, 1]; leading axes are batch axes.
    correct: [..., n] bool or 0/1 correctness, or real-valued kappa in [0, 1].
    tau: scalar threshold in [0, 1).
    temperature: scalar T > 0.

  Returns:
    [...] soft CWSA+.

  Raises:
    ValueError: as :func:`soft_cwsa`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax import soft_cwsa_plus
    >>> c = jnp.array([0.9, 0.6, 0.8, 0.3])
    >>> ok = jnp.array([True, False, True, True])
    >>> print(round(float(soft_cwsa_plus(c, ok, 0.5, temperature=1e-4)), 4))  # (0.8 + 0.6)/3
    0.4667
  """
  confidences, correct, rows = _prepare(confidences, correct)
  tau, tau_flag = _tau(tau)
  temperature, t_flag = _temperature(temperature)
  value = _soft_metric(confidences, correct, tau, temperature, plus=True, normalize="retained")
  return _validation.poison(value, rows=rows, items=_validation.either(tau_flag, t_flag))


@functools.partial(jax.jit, static_argnames=("plus", "normalize"))
def _sweep(confidences, correct, thresholds, temperature, keep=None, *, plus, normalize):
  """[..., T] soft metric at each threshold; ``keep`` as in :func:`_kernel`."""
  fn = functools.partial(_kernel, plus=plus, normalize=normalize)
  fn = jax.vmap(fn, in_axes=(None, None, 0, None, None))  # one kernel, vmapped over thresholds
  fn = _batched(fn, confidences.ndim - 1, masked=keep is not None)
  dtype = confidences.dtype
  return fn(confidences, correct, thresholds.astype(dtype), temperature.astype(dtype), keep)


@_public.float_entry
def soft_cwsa_sweep(confidences: Any, correct: Any, thresholds: Any, *,
                    temperature: Any = 0.01, plus: bool = False,
                    normalize: str = "retained") -> jax.Array:
  """Soft CWSA (or CWSA+) at every threshold: the one-threshold kernel vmapped.

  .. math::

    \\mathrm{out}_{\\ldots, t} = \\mathrm{softCWSA}_T(\\tau_t)
    \\quad (\\text{or } \\mathrm{softCWSA}^+_T(\\tau_t)).

  Equals a loop of :func:`soft_cwsa` / :func:`soft_cwsa_plus` calls; costs
  O(n x len(thresholds)) time and memory.

  Args:
    confidences: [..., n] confidences in [0, 1]; leading axes are batch axes.
    correct: [..., n] bool, 0/1 or real-valued kappa in [0, 1].
    thresholds: [K] thresholds in [0, 1), any order.
    temperature: scalar T > 0.
    plus: compute soft CWSA+ instead of soft CWSA.
    normalize: ``"retained"`` or ``"all"`` (soft CWSA only; see
      :func:`soft_cwsa`).

  Returns:
    [..., K] soft metric at each threshold.

  Raises:
    ValueError: as :func:`soft_cwsa`, and if thresholds is not 1-D and
      non-empty, or ``plus=True`` with ``normalize="all"``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax import soft_cwsa_sweep
    >>> c = jnp.array([0.9, 0.6, 0.8, 0.3])
    >>> ok = jnp.array([True, False, True, True])
    >>> values = soft_cwsa_sweep(c, ok, jnp.array([0.5, 0.7]), temperature=1e-4)
    >>> print([round(float(v), 4) for v in values])
    [0.4, 0.5]
  """
  _check_normalize(normalize)
  if plus and normalize != "retained":
    raise ValueError("normalize='all' applies to CWSA only; CWSA+ always divides by |S|")
  confidences, correct, rows = _prepare(confidences, correct)
  thresholds = _validation.as_float_array(thresholds, "thresholds")
  if thresholds.ndim != 1:
    raise ValueError(f"thresholds must be 1-D [K], got shape {thresholds.shape}")
  _validation.check_nonempty(thresholds, "thresholds")
  tau_flag = _validation.check_threshold(thresholds, "thresholds")
  temperature, t_flag = _temperature(temperature)
  values = _sweep(confidences, correct, thresholds, temperature, plus=plus, normalize=normalize)
  return _validation.poison(values, rows=rows, items=_validation.either(tau_flag, t_flag))


def band_thresholds(band: tuple[float, float], num_thresholds: int) -> np.ndarray:
  """The equally spaced grid used by :func:`soft_cwsa_band_area` (float32)."""
  _check_band(band, num_thresholds)
  return np.linspace(float(band[0]), float(band[1]), int(num_thresholds)).astype(np.float32)


def _check_band(band: Any, num_thresholds: Any) -> None:
  try:
    low, high = (float(b) for b in band)
  except (TypeError, ValueError):
    raise ValueError(f"band must be a pair (low, high) of floats, got {band!r}") from None
  if not (0.0 <= low < high < 1.0):
    raise ValueError(f"band must satisfy 0 <= low < high < 1, got ({low}, {high})")
  if isinstance(num_thresholds, bool) or not isinstance(num_thresholds, (int, np.integer)) \
      or num_thresholds < 2:
    raise ValueError(f"num_thresholds must be an integer >= 2, got {num_thresholds!r}")


@_public.float_entry
def soft_cwsa_band_area(confidences: Any, correct: Any, *,
                        band: tuple[float, float] = DEFAULT_BAND,
                        temperature: Any = 0.01,
                        num_thresholds: int = DEFAULT_BAND_THRESHOLDS,
                        plus: bool = False, normalize: str = "retained",
                        average: bool = True) -> jax.Array:
  """Differentiable area under the soft CWSA-threshold curve over a band.

  With K equally spaced thresholds tau_0 = low < ... < tau_{K-1} = high and
  spacing h = (high - low)/(K - 1), the trapezoid rule gives

  .. math::

    A = \\sum_{k=0}^{K-2} \\frac{h}{2}\\,
        \\bigl(\\mathrm{softCWSA}_T(\\tau_k) + \\mathrm{softCWSA}_T(\\tau_{k+1})\\bigr)
      \\approx \\int_{\\mathrm{low}}^{\\mathrm{high}} \\mathrm{softCWSA}_T(\\tau)\\,d\\tau,

  returned divided by (high - low) when ``average`` (the default), so the
  result is the band-average of the metric, on the metric's own [-1, 1] scale
  (CWSA+: [0, 1]), and can replace a single-threshold soft CWSA in a loss. As
  T -> 0 it converges to the same trapezoid over the hard metric. Note that
  the hard metric jumps where a threshold crosses a confidence; with small T
  the grid only samples it, so use enough thresholds (or a larger T, which
  smooths the curve between grid points) when the band is wide.

  Args:
    confidences: [..., n] confidences in [0, 1]; leading axes are batch axes.
    correct: [..., n] bool, 0/1 or real-valued kappa in [0, 1].
    band: (low, high) with 0 <= low < high < 1. Default (0.5, 0.9).
    temperature: scalar T > 0.
    num_thresholds: K >= 2 grid points (default 9: a spacing of 0.05).
    plus: use soft CWSA+ instead of soft CWSA.
    normalize: ``"retained"`` or ``"all"`` (see :func:`soft_cwsa`).
    average: divide the area by (high - low) (default True).

  Returns:
    [...] the band average (or area).

  Raises:
    ValueError: as :func:`soft_cwsa`, and on a bad band or num_thresholds.

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax import soft_cwsa_band_area
    >>> c = jnp.array([0.95, 0.62, 0.83, 0.3])
    >>> ok = jnp.array([True, False, True, True])
    >>> a = soft_cwsa_band_area(c, ok, band=(0.5, 0.9), temperature=0.02)
    >>> print(round(float(a), 4))  # hard trapezoid on the same grid: 0.548
    0.5326
  """
  _check_normalize(normalize)
  if plus and normalize != "retained":
    raise ValueError("normalize='all' applies to CWSA only; CWSA+ always divides by |S|")
  thresholds = jnp.asarray(band_thresholds(band, num_thresholds))
  confidences, correct, rows = _prepare(confidences, correct)
  temperature, t_flag = _temperature(temperature)
  values = _sweep(confidences, correct, thresholds, temperature, plus=plus, normalize=normalize)
  values = _validation.poison(values, rows=rows, items=t_flag)
  # Trapezoid with equal spacing: h * (sum - (first + last)/2).
  low, high = float(band[0]), float(band[1])
  spacing = (high - low) / (num_thresholds - 1)
  area = spacing * (jnp.sum(values, axis=-1) - 0.5 * (values[..., 0] + values[..., -1]))
  return area / (high - low) if average else area
