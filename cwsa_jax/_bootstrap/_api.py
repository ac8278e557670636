"""The public bootstrap: :func:`bootstrap_samples`, :func:`bootstrap_ci`,
:func:`paired_bootstrap` and :func:`bootstrap_sweep`, each the generic path (``fn`` vmapped
over chunks of gathered resamples) or a form found once (``_fast_forms``, or the evaluation
bootstrap's area scan for the risk-coverage areas). The resamples are described in the
package docstring (:mod:`cwsa_jax._bootstrap`)."""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from cwsa_jax import _public
from cwsa_jax import _stats
from cwsa_jax import _sweep
from cwsa_jax import _validation
from cwsa_jax._bootstrap._checks import _check_common
from cwsa_jax._bootstrap._checks import _check_data
from cwsa_jax._bootstrap._checks import _check_fn
from cwsa_jax._bootstrap._checks import _check_level
from cwsa_jax._bootstrap._engine import _area_options
from cwsa_jax._bootstrap._engine import _area_samples
from cwsa_jax._bootstrap._fast_forms import _FastForm
from cwsa_jax._bootstrap._fast_forms import _fast_block_jit
from cwsa_jax._bootstrap._fast_forms import _fast_form
from cwsa_jax._bootstrap._fast_forms import _fast_paired_block_jit
from cwsa_jax._bootstrap._fast_forms import _sweep_ci_jit
from cwsa_jax._bootstrap._fast_forms import _sweep_estimate_jit
from cwsa_jax._bootstrap._intervals import BootstrapResult
from cwsa_jax._bootstrap._intervals import PairedBootstrapResult
from cwsa_jax._bootstrap._intervals import _interval_jit
from cwsa_jax._bootstrap._intervals import _p_value
from cwsa_jax._bootstrap._intervals import _paired_interval_jit
from cwsa_jax._bootstrap._intervals import _percentiles
from cwsa_jax._bootstrap._intervals import _subtract
from cwsa_jax._bootstrap._runner import _traced
from cwsa_jax._bootstrap._runner import run_blocks
from cwsa_jax._bootstrap._sampler import _RESAMPLING
from cwsa_jax._bootstrap._sampler import _map_block
from cwsa_jax._bootstrap._sampler import _map_resamples
from cwsa_jax._bootstrap._stand_ins import mapped


@functools.partial(jax.jit, static_argnames=("fn", "num_resamples", "chunk_size"))
def _samples_jit(fn, confidences, correct, key, num_resamples, chunk_size):
  return _map_resamples(fn, (confidences, correct), key, num_resamples, chunk_size)


@functools.partial(jax.jit, static_argnames=("fn", "num_resamples", "chunk_size"))
def _ci_jit(fn, confidences, correct, key, level, num_resamples, chunk_size):
  estimate = fn(confidences, correct)
  samples = _map_resamples(fn, (confidences, correct), key, num_resamples, chunk_size)
  return BootstrapResult(estimate, *_percentiles(samples, level))


def _pair_fn(fn: Callable, same_dtype: bool) -> Callable:
  """(c_a, k_a, c_b, k_b) -> (fn(a), fn(b)).

  When the two models' arrays share dtypes, fn is vmapped over the stacked
  pair: both run the same compiled code, so identical models give exactly
  identical values (two separate calls may round differently after fusion).
  """
  def pair(ca, ka, cb, kb):
    if same_dtype:
      out = jax.vmap(fn)(jnp.stack([ca, cb]), jnp.stack([ka, kb]))
      out = jax.tree.map(lambda x: x[0], out), jax.tree.map(lambda x: x[1], out)
    else:
      out = fn(ca, ka), fn(cb, kb)
    return out
  return pair


@functools.partial(jax.jit, static_argnames=("fn", "num_resamples", "chunk_size"))
def _paired_jit(fn, c_a, k_a, c_b, k_b, key, level, num_resamples, chunk_size):
  pair = _pair_fn(fn, c_a.dtype == c_b.dtype and k_a.dtype == k_b.dtype)
  est_a, est_b = pair(c_a, k_a, c_b, k_b)
  difference = jax.tree.map(_subtract, est_a, est_b)

  def diff(*arrays):
    return jax.tree.map(_subtract, *pair(*arrays))

  samples = _map_resamples(diff, (c_a, k_a, c_b, k_b), key, num_resamples, chunk_size)
  low, high = _percentiles(samples, level)
  return PairedBootstrapResult(est_a, est_b, difference, low, high, jax.tree.map(_p_value, samples))


# One jitted call per block (the host loop); _samples_jit, _ci_jit and
# _paired_jit compute the same values in one call (under a transformation).

@functools.partial(jax.jit, static_argnames=("fn",))
def _estimate_jit(fn, confidences, correct):
  return fn(confidences, correct)


@functools.partial(jax.jit, static_argnames=("fn", "size", "num_chunks"), **_RESAMPLING)
def _block_jit(fn, confidences, correct, key, start, size, num_chunks):
  return _map_block(fn, (confidences, correct), key, start, size, num_chunks)


@functools.partial(jax.jit, static_argnames=("fn",))
def _paired_estimate_jit(fn, c_a, k_a, c_b, k_b):
  pair = _pair_fn(fn, c_a.dtype == c_b.dtype and k_a.dtype == k_b.dtype)
  est_a, est_b = pair(c_a, k_a, c_b, k_b)
  return est_a, est_b, jax.tree.map(_subtract, est_a, est_b)


@functools.partial(jax.jit, static_argnames=("fn", "size", "num_chunks"), **_RESAMPLING)
def _paired_block_jit(fn, c_a, k_a, c_b, k_b, key, start, size, num_chunks):
  pair = _pair_fn(fn, c_a.dtype == c_b.dtype and k_a.dtype == k_b.dtype)

  def diff(*arrays):
    return jax.tree.map(_subtract, *pair(*arrays))

  return _map_block(diff, (c_a, k_a, c_b, k_b), key, start, size, num_chunks)


# --- public API -------------------------------------------------------------

@mapped
@_public.entry
def bootstrap_samples(fn: Callable, confidences, correct, *, key, num_resamples: int = 1000,
                      chunk_size: int | None = None):
  """The B resampled values theta*_b = fn(c[I_b], kappa[I_b]) of a metric.

  The raw material of :func:`bootstrap_ci`: same resamples for the same
  ``key`` (and the same as :func:`paired_bootstrap`'s, so the differences of
  two models' samples are its resampled differences, up to float rounding).

  Args:
    fn, confidences, correct, key, num_resamples, chunk_size: as in
      :func:`bootstrap_ci`.

  Returns:
    A pytree with the structure of ``fn``'s output whose leaves have a leading
    resample axis [num_resamples, ...].

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from cwsa_jax import coverage
    >>> s = bootstrap_samples(lambda c, k: coverage(c, 0.5), jnp.array([0.9, 0.2, 0.7, 0.4]),
    ...                       jnp.array([1, 0, 1, 1]), key=jax.random.key(0), num_resamples=5)
    >>> s.shape
    (5,)
  """
  c, k = _check_data(confidences, correct, fn=fn)
  _check_fn(fn)
  key, num_resamples, chunk_size = _check_common(key, num_resamples, chunk_size, c.shape[0])
  if _traced(c, k, key):
    return _samples_jit(fn, c, k, key, num_resamples, chunk_size)
  return run_blocks(lambda start, size, chunks: _block_jit(fn, c, k, key, start, size, chunks),
                    num_resamples, chunk_size, c.shape[0])


@mapped
@_public.entry
def bootstrap_ci(fn: Callable, confidences, correct, *, key, num_resamples: int = 1000,
                 level: float = 0.95, chunk_size: int | None = None) -> BootstrapResult:
  """Percentile bootstrap confidence interval of any metric, including a whole sweep.

  With theta-hat = fn(c, kappa) and B resamples theta*_b = fn(c[I_b],
  kappa[I_b]) (n indices drawn with replacement, see the module docstring),
  alpha = 1 - level:

  .. math::

    [\\mathrm{low}, \\mathrm{high}] = \\left[ Q_{\\alpha/2}(\\theta^*),
    Q_{1-\\alpha/2}(\\theta^*) \\right],

  Q_q being NumPy's default ("linear", Hyndman-Fan type 7) quantile over the
  m resampled values that are not NaN: with x_(0) <= ... <= x_(m-1) and
  h = (m - 1) q, Q_q = x_(floor h) + (h - floor h)(x_(floor h + 1) - x_(floor h)).
  NaN resampled values (e.g. selective accuracy when a resample retains no
  sample) are left out rather than poisoning the interval; if every value is
  NaN, the bounds are NaN. Each element of an array-valued metric gets its own
  interval (pointwise, not simultaneous).

  ``fn`` must be traceable by JAX: it is vmapped over chunks of
  ``chunk_size`` resamples and jitted with the rest (compiled once per ``fn``
  object: define it once and reuse it). Memory holds ``chunk_size * n``
  resampled values at a time. ``fn`` = :func:`~cwsa_jax.ece` itself (or a
  ``functools.partial`` of it with equal-width bins, at most 64) with boolean
  correctness is bucketed once: each resample gathers one packed word per
  draw and sums it into the bins (the same exact sums, so the same values,
  bit for bit). So is a keyword-only ``functools.partial`` of
  :func:`~cwsa_jax.sweep` with its ``thresholds`` (and ``normalize``), as
  :func:`bootstrap_sweep` does it: the same exact sums per resample, values
  equal to float32 rounding (a final division may differ by an ulp, since a
  lambda's thresholds are compile-time constants). ``fn`` =
  :func:`~cwsa_jax.aurc`, :func:`~cwsa_jax.augrc`, :func:`~cwsa_jax.eaurc` or
  :func:`~cwsa_jax.risk_coverage_summary` (or a keyword-only partial with a
  ``"step"`` or ``"trapezoid"`` convention) with boolean correctness is
  sorted once: each resample is a multiplicity per sample over that order
  (the evaluation bootstrap's area scan), the areas equal to float32 rounding
  of their sums. A lambda around any of them takes the generic path: each
  resample recomputes ``fn`` from its gathered samples.

  Real-valued scores and float64 confidences. A resample repeats and drops
  samples: it keeps their order, their ties and each one's side of a fixed
  threshold. So concrete scores are mapped once, on the host, before
  resampling (``_stand_ins``), which is exact: when ``fn`` is a metric of the
  scores' order alone (:func:`~cwsa_jax.aurc`, :func:`~cwsa_jax.augrc`,
  :func:`~cwsa_jax.eaurc`, :func:`~cwsa_jax.risk_coverage_summary`,
  :func:`~cwsa_jax.risk_coverage_curve`, :func:`~cwsa_jax.risk_at_coverage`,
  :func:`~cwsa_jax.coverage_at_risk`, :func:`~cwsa_jax.auroc`,
  :func:`~cwsa_jax.fpr_at_tpr`, :func:`~cwsa_jax.average_precision`),
  scores outside [0, 1] or finer than float32 become float32 stand-ins with
  the same order and ties (the curve's thresholds stay the scores' values:
  that curve compiles per call, its table of values a constant of the
  program), and every value equals that of the scores themselves; when ``fn`` compares
  confidences with fixed thresholds (:func:`~cwsa_jax.cwsa`,
  :func:`~cwsa_jax.cwsa_plus`, :func:`~cwsa_jax.selective_accuracy` at
  ``tau``, :func:`~cwsa_jax.sweep`, :func:`~cwsa_jax.aumcc`, and
  :func:`~cwsa_jax.ece` / :func:`~cwsa_jax.calibration_bins` with
  equal-width bins), float64 confidences become stand-ins at most one float32
  ulp away that keep every float64 comparison with the thresholds. ``fn`` is
  recognised by identity only: the function itself or a keyword-only
  ``functools.partial`` of it. Any other ``fn`` (a lambda, even one around an
  order metric) may need probabilities: it gets float32 confidences in
  [0, 1] as inside ``jit``, real-valued scores raise ``ValueError``, and
  float64 confidences are rounded to float32 (so are equal-mass ECE bins,
  order statistics of each resample). Traced inputs are not mapped: inside
  ``jit`` the confidences are float32 in [0, 1] (others give NaN).

  Args:
    fn: ``(confidences [n], correct [n]) -> metric``, where the metric is a
      scalar, an array or any pytree of them (e.g. :class:`~cwsa_jax.SweepResult`).
    confidences: [n] confidences in [0, 1]; any finite real scores when
      ``fn`` is a metric of their order alone (see above).
    correct: [n] bool or 0/1 correctness, or graded correctness in [0, 1].
    key: a JAX PRNG key (``jax.random.key(seed)``; legacy
      ``jax.random.PRNGKey`` keys work too).
    num_resamples: B >= 1.
    level: confidence level in (0, 1).
    chunk_size: resamples evaluated at once (>= 1); default
      max(1, 65536 // n). It changes speed and memory, not the resamples
      (the values are bitwise equal for this library's metrics, whose sums
      are exact; other metrics may round differently under ``vmap``).

  Returns:
    :class:`BootstrapResult` ``(estimate, low, high)``, each with the
    structure of ``fn``'s output (``low``/``high`` leaves are floating).

  Raises:
    ValueError: on a bad key, level, num_resamples, chunk_size or fn, or on
      inputs that are not 1-D, differ in shape, are empty, or hold NaN, or
      hold values outside [0, 1] for an ``fn`` that is not a metric of the
      scores' order alone (the message says so); on float64 confidences
      between two thresholds that float32 rounds to one value.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from cwsa_jax import cwsa
    >>> c = jnp.array([0.95, 0.9, 0.85, 0.8, 0.7, 0.65, 0.6, 0.55])
    >>> ok = jnp.array([1, 1, 1, 0, 1, 0, 1, 0])
    >>> r = bootstrap_ci(lambda c, k: cwsa(c, k, 0.5), c, ok, key=jax.random.key(0),
    ...                  num_resamples=200)
    >>> print(f"{float(r.estimate):.3f} [{float(r.low):.3f}, {float(r.high):.3f}]")
    0.250 [-0.100, 0.551]
  """
  c, k = _check_data(confidences, correct, fn=fn)
  _check_fn(fn)
  key, num_resamples, chunk_size = _check_common(key, num_resamples, chunk_size, c.shape[0])
  level = _check_level(level)
  if _traced(c, k, key, level):
    return _ci_jit(fn, c, k, key, jnp.float32(level), num_resamples, chunk_size)
  estimate = _estimate_jit(fn, c, k)
  area = _area_options(fn, k)
  if area is not None:  # sort once
    samples = _area_samples(*area, (c, k), key=key, num_resamples=num_resamples)
    return BootstrapResult(estimate, *_interval_jit(samples, jnp.float32(level)))
  form = _fast_form(fn, c, k)
  if form is not None:  # bucket once
    block = lambda start, size, chunks: _fast_block_jit(form, key, start, size, chunks)  # noqa: E731
  else:
    block = lambda start, size, chunks: _block_jit(fn, c, k, key, start, size, chunks)  # noqa: E731
  samples = run_blocks(block, num_resamples, chunk_size, c.shape[0])
  return BootstrapResult(estimate, *_interval_jit(samples, jnp.float32(level)))


@mapped
@_public.entry
def paired_bootstrap(fn: Callable, confidences_a, correct_a, confidences_b, correct_b, *, key,
                     num_resamples: int = 1000, level: float = 0.95,
                     chunk_size: int | None = None) -> PairedBootstrapResult:
  """Paired bootstrap of the difference fn(A) - fn(B) of two models on the same test set.

  Both models must be scored on the same n samples in the same order; every
  resample uses the same indices I_b for both, so the variation the test set
  shares cancels. With d-hat = fn(a) - fn(b) and
  d*_b = fn(a[I_b]) - fn(b[I_b]) over the B resamples, [low, high] is the
  percentile interval of the d*_b (as in :func:`bootstrap_ci`) and the
  two-sided p-value of H0: difference = 0 is

  .. math::

    p = \\min\\left(1,\\; 2 \\min\\left(
      \\frac{1 + \\#\\{b : d^*_b \\le 0\\}}{1 + B},\\;
      \\frac{1 + \\#\\{b : d^*_b \\ge 0\\}}{1 + B} \\right)\\right),

  so p >= 2/(1 + B) is never 0 and p = 1 when the models agree on every
  resample. NaN differences are left out of the quantiles and of the counts
  (B then counts the non-NaN ones); all-NaN gives NaN. The forms of ``fn``
  that :func:`bootstrap_ci` buckets or sorts once are bucketed or sorted once
  per model here, and its scores are mapped as there (real-valued scores of an
  order metric: one set of stand-ins for both models' scores together, so
  the curve's thresholds map back to either model's values).

  Args:
    fn: as in :func:`bootstrap_ci`.
    confidences_a, correct_a: model A's [n] confidences and correctness.
    confidences_b, correct_b: model B's, on the same samples in the same order.
    key, num_resamples, level, chunk_size: as in :func:`bootstrap_ci`.

  Returns:
    :class:`PairedBootstrapResult` ``(estimate_a, estimate_b, difference,
    low, high, p_value)``, each with the structure of ``fn``'s output.

  Raises:
    ValueError: as :func:`bootstrap_ci`, and when the models' n differ.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from cwsa_jax import cwsa
    >>> c = jnp.array([0.95, 0.9, 0.85, 0.8, 0.7, 0.65, 0.6, 0.55])
    >>> ok = jnp.array([1, 1, 1, 0, 1, 0, 1, 0])
    >>> r = paired_bootstrap(lambda c, k: cwsa(c, k, 0.5), c, ok, c, jnp.ones(8, bool),
    ...                      key=jax.random.key(0), num_resamples=200)
    >>> print(f"{float(r.difference):.3f} [{float(r.low):.3f}, {float(r.high):.3f}] "
    ...       f"p = {float(r.p_value):.3f}")
    -0.250 [-0.576, -0.025] p = 0.050
  """
  c_a, k_a = _check_data(confidences_a, correct_a, "_a", fn=fn)
  c_b, k_b = _check_data(confidences_b, correct_b, "_b", fn=fn)
  if c_a.shape != c_b.shape:
    raise ValueError(
        f"models a and b must be scored on the same samples: got n = {c_a.shape[0]} and "
        f"n = {c_b.shape[0]}")
  _check_fn(fn)
  key, num_resamples, chunk_size = _check_common(key, num_resamples, chunk_size, c_a.shape[0])
  level = _check_level(level)
  if _traced(c_a, k_a, c_b, k_b, key, level):
    return _paired_jit(fn, c_a, k_a, c_b, k_b, key, jnp.float32(level), num_resamples, chunk_size)
  estimates = _paired_estimate_jit(fn, c_a, k_a, c_b, k_b)
  area = _area_options(fn, k_a) if _area_options(fn, k_b) is not None else None
  if area is not None:  # sort each model once
    samples = _area_samples(*area, (c_a, k_a), (c_b, k_b), key=key, num_resamples=num_resamples)
    return PairedBootstrapResult(*estimates, *_paired_interval_jit(samples, jnp.float32(level)))
  form_a, form_b = _fast_form(fn, c_a, k_a), _fast_form(fn, c_b, k_b)
  if form_a is not None and form_b is not None:  # bucket each model once
    block = lambda start, size, chunks: _fast_paired_block_jit(  # noqa: E731
        form_a, form_b, key, start, size, chunks)
  else:
    block = lambda start, size, chunks: _paired_block_jit(  # noqa: E731
        fn, c_a, k_a, c_b, k_b, key, start, size, chunks)
  samples = run_blocks(block, num_resamples, chunk_size, c_a.shape[0])
  return PairedBootstrapResult(*estimates, *_paired_interval_jit(samples, jnp.float32(level)))


@mapped
@_public.entry
def bootstrap_sweep(confidences, correct, thresholds, *, key, num_resamples: int = 1000,
                    level: float = 0.95, chunk_size: int | None = None,
                    normalize: str = "retained") -> BootstrapResult:
  """:func:`bootstrap_ci` of a whole :func:`~cwsa_jax.sweep`, faster.

  The same resamples and the same interval as
  ``bootstrap_ci(lambda c, k: sweep(c, k, thresholds), ...)`` for the same
  ``key``, but the inputs are checked and bucketed once, not once per
  resample. With boolean correctness and at most 63 thresholds a resample
  gathers one int32 word per draw, the sample's segment (its bucket and
  correctness) and ``1 - c`` in units of 2^-24 (``_sweep.pack_samples``), and
  sums the words' fields (``_sweep.packed_bucket_sums``); otherwise it
  gathers the bucket and the confidence (boolean correctness in its sign bit;
  graded: c and kappa) into the sweep's own sums (``_sweep.bucket_sums``).
  The per-resample sums are the same exact integers, so the resampled values
  agree with the generic path to float32 rounding of the final divisions.
  Concrete float64 confidences are compared with the thresholds in float64,
  as :func:`bootstrap_ci` does for ``sweep``.

  Args:
    confidences: [n] confidences in [0, 1] (real-valued scores raise ``ValueError``).
    correct, key, num_resamples, level, chunk_size: as in :func:`bootstrap_ci`.
    thresholds: [T] thresholds in [0, 1).
    normalize: as in :func:`~cwsa_jax.sweep`.

  Returns:
    :class:`BootstrapResult` whose fields are :class:`~cwsa_jax.SweepResult`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> c = jnp.array([0.95, 0.9, 0.85, 0.8, 0.7, 0.65, 0.6, 0.55])
    >>> ok = jnp.array([1, 1, 1, 0, 1, 0, 1, 0], bool)
    >>> r = bootstrap_sweep(c, ok, jnp.array([0.5, 0.8]), key=jax.random.key(0), num_resamples=200)
    >>> print(f"{float(r.estimate.cwsa[0]):.3f} [{float(r.low.cwsa[0]):.3f}, {float(r.high.cwsa[0]):.3f}]")
    0.250 [-0.100, 0.551]
  """
  _stats.check_normalize(normalize)
  c, k = _check_data(confidences, correct, fn=_sweep.sweep)
  t = _validation.as_thresholds(thresholds)
  key, num_resamples, chunk_size = _check_common(key, num_resamples, chunk_size, c.shape[0])
  level = _check_level(level)
  # Resamples gather exact integer columns: no derivative (an error, not a zero).
  no_gradient = ("bootstrap_sweep resamples exact integer sums and has no derivative; use "
                 "bootstrap_ci(lambda c, k: sweep(c, k, thresholds), ...) to differentiate")
  c = _validation.refuse_gradient(c.astype(jnp.float32), no_gradient)
  k = _validation.refuse_gradient(k, no_gradient)
  if _traced(c, k, t, key, level):
    return _sweep_ci_jit(c, k, t, key, jnp.float32(level), num_resamples, chunk_size, normalize)
  estimate, per_sample, invalid = _sweep_estimate_jit(c, k, t, normalize)
  form = _FastForm(("sweep", normalize), per_sample, (t,), invalid)
  samples = run_blocks(lambda start, size, chunks: _fast_block_jit(form, key, start, size, chunks),
                       num_resamples, chunk_size, c.shape[0])
  return BootstrapResult(estimate, *_interval_jit(samples, jnp.float32(level)))
