r"""Smooth ECE: the kernel-smoothed calibration error of Błasiok and Nakkiran (2023).

The residuals ``r_i = c_i - kappa_i`` are smoothed over the confidence axis by
a Gaussian of width ``sigma`` reflected at 0 and 1, and the smoothed residual
is integrated in absolute value, normalised by the smoothed density:

.. math::

  \hat r_\sigma(t) = \sum_i K_\sigma(t, c_i)\,(c_i - \kappa_i),\quad
  \hat\delta_\sigma(t) = \sum_i K_\sigma(t, c_i),\quad
  \mathrm{smECE}_\sigma = \frac{\int_0^1 |\hat r_\sigma(t)|\,dt}{\int_0^1 \hat\delta_\sigma(t)\,dt},

  K_\sigma(t, c) = \varphi_\sigma(t - c) + \varphi_\sigma(t + c) + \varphi_\sigma(t - 2 + c),

with ``phi_sigma`` the Gaussian density of standard deviation ``sigma``,
truncated at ``|t - c| <= 1/2`` as in ``relplot``. With the automatic
bandwidth, ``sigma*`` is the fixed point ``smECE_{sigma*} = sigma*`` (unique, as
``smECE_sigma - sigma`` decreases in ``sigma``) and the result is ``smECE_{sigma*}``.

**Discretisation, as ``relplot``.** The samples are spread onto a mesh of
8001 points by linear interpolation (O(n), once), and
each bandwidth costs FFTs of the mesh (O(mesh log mesh)), whatever ``n``.
``relplot`` (1.0.3) does the same on 1001 points (more below
``sigma = 0.01``); two of its details change the value by more than 1e-5,
so they are kept: a sample in the first or last cell of its mesh loses up
to half its weight (the mesh node on the boundary is reflected onto
itself), and the integrals are sums over ``T = max(10/sigma, 200)``
equally spaced points, whose end points count in full (the end-point term
of the Euler-Maclaurin formula, added to a trapezoid integral here). The
result agrees with ``relplot.smECE_sigma`` within 1e-4 for bandwidths of
0.01 and more (1e-5 typically; tests/test_smooth_ece.py). Below 0.01,
relplot's mesh size varies with ``sigma`` and, when it is even, shifts its
smoothed curves by half a cell: up to 3e-4 more where many confidences are
near 1; that artifact is not reproduced (it would make the value jump
with ``sigma``, hence the automatic bandwidth stick at the jumps).

**Automatic bandwidth.** Bisection on ``[0.001, 1]`` of the predicate
``sigma < smECE_sigma``, like ``relplot.smECE``, but run to the precision
of the dtype (25 steps in float32, 54 in float64) instead of relplot's 10:
the result is the fixed point, a continuous function of the samples.
relplot stops up to 2^-10 above it and returns ``smECE`` there, so where
``smECE_sigma`` falls steeply with ``sigma`` (well calibrated models) its
value is smaller than this one, by up to about 1e-3. relplot's floor is
kept: when the fixed point is below 0.001, ``sigma* = 0.001``.
The command line's bootstrap finds the same fixed point for many resamples
at once by a faster bracketed search (:func:`searched_smooth_ece`); it agrees
with this bisection to float32 rounding (about 1e-7), not bit for bit, so
``smooth_ece`` keeps the bisection and its values.

**Gradients.** At a fixed bandwidth autodiff differentiates the mesh sums
and FFTs (the linear interpolation is piecewise linear in ``c``: kinks at
mesh points). With the automatic bandwidth, ``sigma*`` solves
``g(sigma, c) = sigma`` with ``g = max(smECE_sigma, 0.001)``, so by the
implicit function theorem ``d sigma*/dc = (dg/dc) / (1 - dg/dsigma)``
(a ``jax.custom_jvp``; the bisection itself is not differentiated).

**Invalid values.** Concrete NaN/inf or out-of-range confidences or
correctness, or a bandwidth that is not finite and > 0, raise
``ValueError``; inside a user's ``jit`` / ``vmap`` they give NaN.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from cwsa_jax import _public
from cwsa_jax import _validation

# relplot's 1000-interval mesh refined 8 times: its mesh points (and the
# cells of its boundary rule) are mesh points here, and a bandwidth of 0.001
# still spans 8 cells.
_MESH_INTERVALS = 8000
_RELPLOT_INTERVALS = 1000
# relplot's constants: the smallest automatic bandwidth, the evaluation
# points T = max(10 / sigma, 200) and the 1e-4 added to the density at each.
MIN_BANDWIDTH = 1e-3
_POINTS_PER_UNIT_BANDWIDTH = 10.0
_MIN_POINTS = 200.0
_DENSITY_EPS = 1e-4


def _mesh_sums(confidences: jax.Array, correct: jax.Array,
               repeats: jax.Array | None = None) -> jax.Array:
  """[2, L + 1] residuals and counts spread onto the mesh by linear interpolation.

  ``repeats`` [n] (float, whole numbers; None: 1) counts each row that many times, as if
  repeated (a bootstrap resample's weights): each share is multiplied by it.
  """
  size = _MESH_INTERVALS
  x = confidences * size
  cell = jnp.clip(jnp.floor(x), 0, size - 1)
  frac = x - cell  # 1 for a confidence of exactly 1 (its whole weight on the last node)
  cell = cell.astype(jnp.int32)
  weights = jnp.stack([confidences - correct, jnp.ones_like(confidences)])  # [2, n]
  if repeats is not None:
    weights = weights * repeats
  sums = jnp.zeros((2, size + 1), confidences.dtype)
  sums = sums.at[:, cell].add(weights * (1 - frac))
  return sums.at[:, cell + 1].add(weights * frac)


def _spectrum(sums: jax.Array) -> jax.Array:
  """rfft of the mesh sums extended evenly to period 2L (the reflections at 0 and 1)."""
  extended = jnp.concatenate([sums, sums[:, -2:0:-1]], axis=-1)
  return jnp.fft.rfft(extended, axis=-1)


def _boundary_nodes(sums: jax.Array) -> jax.Array:
  """[2, 2, P] the mesh sums at the first and last ``P`` mesh points after the boundary ones."""
  span = _MESH_INTERVALS // _RELPLOT_INTERVALS
  return jnp.stack([sums[:, 1:span + 1], sums[:, -2:-span - 2:-1]], axis=1)


def boundary_corrected(sigma: jax.Array, spectrum: jax.Array, near: jax.Array) -> jax.Array:
  """:func:`_spectrum` [..., 2, L + 1] less what relplot's mesh at bandwidth ``sigma`` puts on
  the boundary nodes from the samples ``near`` them (:func:`_boundary_nodes`)."""
  size = _MESH_INTERVALS
  dtype = spectrum.real.dtype
  # relplot's mesh has max(1000, round(20 / sigma) // 2) intervals (unrounded here, so that
  # the value is smooth in sigma). A sample in its first (last) cell puts a share u of its
  # weight on the boundary node, which counts half (reflected onto itself); here the sample
  # counts fully, so the boundary node loses u (half of it counting).
  relplot_cells = jnp.maximum(_RELPLOT_INTERVALS, 10 / sigma)
  offsets = jnp.arange(1, near.shape[-1] + 1, dtype=dtype)
  u = jnp.maximum(0, 1 - offsets * relplot_cells / size)
  removed = jnp.sum(near * u, axis=-1)  # [2 (residual, count), 2 (at 0, at 1)]
  alternating = jnp.where(jnp.arange(size + 1) % 2 == 0, 1, -1).astype(dtype)
  return spectrum - removed[:, :1] - removed[:, 1:] * alternating


def kernel_spectrum(sigma: jax.Array, dtype) -> jax.Array:
  """rfft of the Gaussian kernel of bandwidth ``sigma`` on the 2L-periodic mesh, cut at |d| > 1/2."""
  size = _MESH_INTERVALS
  d = jnp.arange(2 * size, dtype=dtype)
  d = jnp.where(d <= size, d, d - 2 * size) / size
  kernel = jnp.exp(-0.5 * jnp.square(d / sigma)) / (math.sqrt(2 * math.pi) * sigma)
  kernel = jnp.where(jnp.abs(d) <= 0.5, kernel, 0)
  return jnp.fft.rfft(kernel)


def _smoothed_error(sigma: jax.Array, spectrum: jax.Array, near: jax.Array) -> jax.Array:
  """smECE at bandwidth ``sigma`` from :func:`_spectrum` and :func:`_boundary_nodes`."""
  size = _MESH_INTERVALS
  spectrum = boundary_corrected(sigma, spectrum, near)
  smoothed = jnp.fft.irfft(spectrum * kernel_spectrum(sigma, spectrum.real.dtype), n=2 * size,
                           axis=-1)[:, :size + 1]
  residual, density = jnp.abs(smoothed[0]), smoothed[1]

  # relplot sums over T points: a trapezoid integral plus the end points' other halves.
  points = jnp.maximum(_POINTS_PER_UNIT_BANDWIDTH / sigma, _MIN_POINTS)
  end = 1 / (2 * (points - 1))
  trapezoid = lambda y: (jnp.sum(y) - (y[0] + y[-1]) / 2) / size  # noqa: E731
  numerator = trapezoid(residual) + end * (residual[0] + residual[-1])
  denominator = (trapezoid(density) + end * (density[0] + density[-1])
                 + _DENSITY_EPS * points / (points - 1))
  return numerator / denominator


def _floored(sigma, spectrum, near):
  return jnp.maximum(_smoothed_error(sigma, spectrum, near), MIN_BANDWIDTH)


@jax.custom_jvp
def _bandwidth(spectrum: jax.Array, near: jax.Array) -> jax.Array:
  """The automatic bandwidth: the fixed point of ``max(smECE_sigma, 0.001)`` in [0.001, 1]."""
  dtype = near.dtype
  steps = jnp.finfo(dtype).nmant + 2  # halvings of [0.001, 1] down to the dtype's precision

  def halve(_, bounds):
    low, high = bounds
    middle = (low + high) / 2
    above = _floored(middle, spectrum, near) > middle  # the fixed point is above the middle
    return jnp.where(above, middle, low), jnp.where(above, high, middle)

  bounds = (jnp.asarray(MIN_BANDWIDTH, dtype), jnp.asarray(1, dtype))
  return jax.lax.fori_loop(0, steps, halve, bounds)[1]


@_bandwidth.defjvp
def _bandwidth_jvp(primals, tangents):
  spectrum, near = primals
  sigma = _bandwidth(spectrum, near)
  # Implicit function theorem on g(sigma, data) = sigma.
  _, by_data = jax.jvp(lambda s, b: _floored(sigma, s, b), primals, tangents)
  _, by_sigma = jax.jvp(lambda s: _floored(s, spectrum, near), (sigma,), (jnp.ones_like(sigma),))
  return sigma, by_data / (1 - by_sigma)


def _row(confidences: jax.Array, correct: jax.Array, bandwidth: jax.Array | None) -> jax.Array:
  """smECE of one row [n] at ``bandwidth`` (None: the automatic one)."""
  sums = _mesh_sums(confidences, correct)
  spectrum, near = _spectrum(sums), _boundary_nodes(sums)
  sigma = _bandwidth(spectrum, near) if bandwidth is None else bandwidth
  return _smoothed_error(sigma, spectrum, near)


@jax.jit
def automatic_bandwidth(confidences: jax.Array, correct: jax.Array) -> jax.Array:
  """The automatic bandwidth ``sigma*`` of one row [n] of checked float inputs."""
  sums = _mesh_sums(confidences, correct)
  return _bandwidth(_spectrum(sums), _boundary_nodes(sums))


# --------------------------------------------------------------------------
# Many resamples' automatic bandwidths at once (the CLI's bootstrap intervals)
# --------------------------------------------------------------------------


def _smoothed_error_one_inverse(sigma: jax.Array, spectrum: jax.Array,
                                near: jax.Array) -> jax.Array:
  """:func:`_smoothed_error` with one inverse FFT (the residual's) instead of two.

  The smoothed density is even and 2L-periodic, so its trapezoid over [0, 1] is its
  spectrum's constant term over 2L, and its values at t = 0 and t = 1 are sums of its
  spectrum (the inner frequencies twice, signs alternating at 1). The same quantity as
  :func:`_smoothed_error`, up to float32 rounding.
  """
  size = _MESH_INTERVALS
  dtype = spectrum.real.dtype
  spectrum = boundary_corrected(sigma, spectrum, near)
  kernel = kernel_spectrum(sigma, dtype)
  residual = jnp.abs(jnp.fft.irfft(spectrum[0] * kernel, n=2 * size)[:size + 1])
  density = (spectrum[1] * kernel).real
  twice = jnp.where((jnp.arange(size + 1) % size) == 0, 1, 2).astype(dtype)
  alternating = jnp.where(jnp.arange(size + 1) % 2 == 0, 1, -1).astype(dtype)
  density_ends = jnp.sum(twice * density * (1 + alternating)) / (2 * size)

  points = jnp.maximum(_POINTS_PER_UNIT_BANDWIDTH / sigma, _MIN_POINTS)
  end = 1 / (2 * (points - 1))
  numerator = ((jnp.sum(residual) - (residual[0] + residual[-1]) / 2) / size
               + end * (residual[0] + residual[-1]))
  denominator = (density[0] / (2 * size) + end * density_ends
                 + _DENSITY_EPS * points / (points - 1))
  return numerator / denominator


# The bracketed search stops when its bracket is this narrow (the bisection of _bandwidth ends
# within (1 - 0.001) / 2**25 of the fixed point in float32) or after this many steps.
_SEARCH_TOLERANCE = 2.0 ** -25
_MAX_SEARCH_STEPS = 40


def _searched_bandwidth(sums: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(``sigma*``, smECE there) of one float32 row's mesh sums [2, L + 1] by a bracketed search.

  The fixed point of :func:`_bandwidth`, ``sigma = max(smECE_sigma, 0.001)`` in [0.001, 1],
  found by Chandrupatla's method (an inverse quadratic step where the last three points
  allow it, else halving) in about 12 evaluations of :func:`_smoothed_error_one_inverse`
  instead of the bisection's 26 of :func:`_smoothed_error`, to the bisection's precision.
  Not the bisection's float32 value bit for bit (another sequence of points, and another
  rounding of the error): the two agree to float32 rounding, about 1e-7 in the smooth ECE.
  Not differentiated (the bootstrap's resamples need values only).
  """
  spectrum, near = _spectrum(sums), _boundary_nodes(sums)
  eps = jnp.finfo(jnp.float32).eps

  def evaluate(sigma):  # (max(smECE, 0.001) - sigma: decreasing in sigma, smECE)
    error = _smoothed_error_one_inverse(sigma, spectrum, near)
    return jnp.maximum(error, MIN_BANDWIDTH) - sigma, error

  low, high = jnp.float32(MIN_BANDWIDTH), jnp.float32(1)
  # Both ends in one batched evaluation (one copy of the FFTs to compile): f_low >= 0 >= f_high.
  (f_low, f_high), (e_low, e_high) = jax.vmap(evaluate)(jnp.stack([low, high]))
  # x1: the newest point, x2: the other end of the bracket, x3: the point x1 or x2 replaced.
  state = (jnp.int32(0), jnp.float32(0.5), high, low, low, f_high, f_low, f_low, e_high, e_low)

  def best(st):
    _, _, x1, x2, _, f1, f2, _, e1, e2 = st
    first = jnp.abs(f1) < jnp.abs(f2)
    return jnp.where(first, x1, x2), jnp.where(first, f1, f2), jnp.where(first, e1, e2)

  def running(st):
    x, fx, _ = best(st)
    width = jnp.abs(st[3] - st[2])
    return (st[0] < _MAX_SEARCH_STEPS) & (fx != 0) & (width > 2 * eps * x + _SEARCH_TOLERANCE)

  def step(st):
    k, t, x1, x2, x3, f1, f2, f3, e1, e2 = st
    xt = x1 + t * (x2 - x1)
    ft, et = evaluate(xt)
    kept = jnp.sign(ft) == jnp.sign(f1)  # xt replaces x1, else x1 becomes the bracket's end
    x3, f3 = jnp.where(kept, x1, x2), jnp.where(kept, f1, f2)
    x2, f2, e2 = (jnp.where(kept, a, b) for a, b in ((x2, x1), (f2, f1), (e2, e1)))
    x1, f1, e1 = xt, ft, et
    xi, phi = (x1 - x2) / (x3 - x2), (f1 - f2) / (f3 - f2)
    quadratic = (phi * phi < xi) & ((1 - phi) * (1 - phi) < 1 - xi)
    tq = (f1 / (f2 - f1) * f3 / (f2 - f3)
          + (x3 - x1) / (x2 - x1) * f1 / (f3 - f1) * f2 / (f3 - f2))
    t = jnp.where(quadratic & jnp.isfinite(tq), tq, 0.5)
    # At least the tolerance into the bracket from either end: it shrinks every step.
    xm = jnp.where(jnp.abs(f1) < jnp.abs(f2), x1, x2)
    limit = jnp.minimum((2 * eps * xm + _SEARCH_TOLERANCE / 2) / jnp.abs(x2 - x1), 0.5)
    return k + 1, jnp.clip(t, limit, 1 - limit), x1, x2, x3, f1, f2, f3, e1, e2

  sigma, _, error = best(jax.lax.while_loop(running, step, state))
  return sigma, error


@jax.jit
def searched_smooth_ece(sums: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(``sigma*`` [B], smooth ECE [B]) of float32 mesh sums [B, 2, L + 1], one program.

  :func:`_searched_bandwidth` vmapped over the rows: the automatic bandwidth and the smooth
  ECE of many rows (the CLI's bootstrap resamples, :func:`_mesh_sums` with ``repeats``),
  each within float32 rounding of :func:`smooth_ece` of the rows the sums were made from.
  All-zero sums (padding) give a finite value.
  """
  return jax.vmap(_searched_bandwidth)(sums)


@functools.partial(jax.jit, static_argnames="automatic")
def _smooth_ece_jit(confidences, correct, bandwidth, *, automatic):
  fn = functools.partial(_row, bandwidth=None) if automatic else _row
  in_axes = (0, 0) if automatic else (0, 0, None)
  for _ in range(confidences.ndim - 1):
    fn = jax.vmap(fn, in_axes=in_axes)
  args = (confidences, correct) if automatic else (confidences, correct, bandwidth)
  return fn(*args)


@_public.float_entry
def smooth_ece(confidences: Any, correct: Any, *, bandwidth: Any = None) -> jax.Array:
  r"""Smooth ECE (smECE): calibration error of kernel-smoothed residuals, as ``relplot``.

  .. math::

    \mathrm{smECE}_\sigma = \frac{\int_0^1 \bigl|\sum_i K_\sigma(t, c_i)(c_i - \kappa_i)\bigr|\,dt}
                                 {\int_0^1 \sum_i K_\sigma(t, c_i)\,dt},
    \qquad \mathrm{smECE} = \mathrm{smECE}_{\sigma^*},\quad
    \sigma^* = \mathrm{smECE}_{\sigma^*},

  with ``K_sigma`` the Gaussian kernel reflected at 0 and 1 (module
  docstring). ``relplot.smECE_sigma(c, kappa, sigma)`` is
  ``smooth_ece(c, kappa, bandwidth=sigma)``; ``relplot.smECE(c, kappa)``
  stops its bandwidth search early, this function finds the fixed point.

  Args:
    confidences: [..., n] confidences in [0, 1]; leading axes are batch axes
      (the function is also ``jax.vmap``-able).
    correct: [..., n] bool or 0/1 correctness, or graded kappa in [0, 1].
    bandwidth: None (default) for the automatic bandwidth ``sigma*`` (at
      least 0.001), or a scalar ``sigma > 0``, in units of confidence (the
      mesh resolves ``sigma >= 0.001``).

  Returns:
    [...] smooth ECE in [0, 1], in the inputs' float dtype (float32 at least).
    Differentiable in the confidences and a graded correctness, the
    automatic bandwidth included (implicit function theorem).

  Raises:
    ValueError: on concrete inputs with NaN/inf or values outside [0, 1], a
      bandwidth that is not a finite scalar > 0, mismatched shapes or no
      samples. Inside a user's ``jit`` / ``vmap`` such values give NaN.

  Examples:
    >>> from cwsa_jax import smooth_ece
    >>> c, ok = [0.9, 0.9, 0.8, 0.6, 0.7], [1, 1, 0, 1, 0]
    >>> print(round(float(smooth_ece(c, ok, bandwidth=0.05)), 4))
    0.3087
    >>> print(round(float(smooth_ece(c, ok)), 4))
    0.1849

  References:
    Jarosław Błasiok and Preetum Nakkiran, "Smooth ECE: Principled
    Reliability Diagrams via Kernel Smoothing", arXiv:2309.12236 (2023);
    their package ``relplot`` (https://github.com/apple/ml-calibration).
  """
  confidences = _validation.as_float_array(confidences, "confidences")
  correct = _validation.correct_array(correct)
  rows = _validation.check_samples(confidences, correct)
  dtype = jnp.promote_types(confidences.dtype, jnp.float32)
  confidences, correct = confidences.astype(dtype), correct.astype(dtype)
  flag = None
  if bandwidth is not None:
    bandwidth, flag = _validation.temperature(bandwidth, "bandwidth")
    bandwidth = bandwidth.astype(dtype)
  value = _smooth_ece_jit(confidences, correct, bandwidth, automatic=bandwidth is None)
  return _validation.poison(value, rows=rows, items=flag)
