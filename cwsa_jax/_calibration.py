"""Binned calibration error (ECE, RMS calibration error, MCE) and reliability-diagram bins.

Top-label calibration: each sample contributes its confidence (usually the max
softmax probability) and whether that prediction was correct. Samples are
grouped into bins; within bin ``b`` the mean confidence ``conf_b`` is compared
with the accuracy ``acc_b``.

Bin conventions (keyword ``binning=``):

* ``"width"`` (default): ``num_bins`` equal-width bins with edges
  ``e_j = float32(j) / float32(num_bins)``; bin ``j`` is ``[e_j, e_{j+1})`` and
  the last bin is closed, ``[e_{B-1}, 1]``, so a confidence of exactly 1.0 is
  counted (several libraries silently drop it). A confidence equal to an
  interior edge belongs to the bin *above* it.
* ``"mass"``: equal-count bins ("adaptive" binning). With the confidences
  sorted ascending, ``s_0 <= ... <= s_{n-1}``, the interior edges are the
  order statistics ``e_j = s_{ceil(j n / B)}`` for ``j = 1..B-1`` (``e_0 = 0``,
  ``e_B = 1``), and membership uses the same rule as above: ``e_j <= c <
  e_{j+1}``. Because membership depends only on the value, **tied confidences
  always share a bin**: a tie group straddling a quantile moves whole into the
  bin that starts at its value. Without ties every bin holds ``floor(n/B)`` or
  ``ceil(n/B)`` samples; with ties some bins hold more and some may be empty
  (repeated edges).

Empty bins contribute nothing. Invalid values raise ``ValueError`` on concrete
inputs; inside a user's ``jax.jit`` / ``jax.vmap`` they give NaN (for the
invalid row; bin counts -1).

Gradients: with the bin membership fixed (it is locally constant in the
confidences, equal-mass edges included), every per-bin sum is linear in c
and kappa, so the ECE family is differentiable almost everywhere (away from
bin edges, ties at mass-bin edges, and bins whose gap is exactly 0 under the
l1/max norms) and autodiff returns that derivative exactly: for ECE,
``d/dc_i = sign(sum_{j in b(i)} (c_j - kappa_j)) / n``.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cwsa_jax import _validation

NORMS = ("l1", "l2", "max")
BINNINGS = ("width", "mass")
# Up to this many bins the per-bin sums are a fused one-hot reduction (tree
# summation, accurate in float32); above it a scatter-add (segment_sum).
_ONE_HOT_MAX_BINS = 128


class CalibrationBins(NamedTuple):
  """Per-bin statistics for a reliability diagram.

  Attributes:
    edges: [..., B + 1] bin edges, ``edges[0] = 0`` and ``edges[B] = 1``.
    count: [..., B] int32 number of samples per bin.
    mean_confidence: [..., B] mean confidence per bin (NaN for an empty bin).
    accuracy: [..., B] mean correctness per bin (NaN for an empty bin).
  """
  edges: jax.Array
  count: jax.Array
  mean_confidence: jax.Array
  accuracy: jax.Array


def _check_options(num_bins: Any, binning: str, norm: str | None = None) -> None:
  if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)):
    raise ValueError(f"num_bins must be an int >= 1, got {num_bins!r}")
  if num_bins < 1:
    raise ValueError(f"num_bins must be >= 1, got {num_bins}")
  if binning not in BINNINGS:
    raise ValueError(f"binning must be one of {BINNINGS}, got {binning!r}")
  if norm is not None and norm not in NORMS:
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")


def _prepare(confidences: Any, correct: Any):
  c, k, invalid = _validation.samples(confidences, correct)
  return c, k.astype(jnp.float32), invalid


def _batched(fn, ndim: int):
  for _ in range(ndim - 1):
    fn = jax.vmap(fn)
  return fn


def _edges(c: jax.Array, num_bins: int, binning: str) -> jax.Array:
  if binning == "width":
    # Built in NumPy: XLA on CPU divides through a reciprocal, which is not
    # correctly rounded, and a confidence equal to an edge must compare equal.
    return jnp.asarray(np.arange(num_bins + 1, dtype=np.float32) / np.float32(num_bins))
  n = c.shape[0]
  # ceil(j n / B) in exact integer arithmetic (n and B are static).
  positions = np.array([-(-j * n // num_bins) for j in range(1, num_bins)], dtype=np.int32)
  # Non-negative float32 sort like their int32 bit patterns: an integer sort is
  # much faster than a float sort on CPU.
  clipped = jnp.minimum(jnp.where(c > 0, c, jnp.float32(0.0)), jnp.float32(1.0))  # -0.0 -> 0.0
  bits = lax.bitcast_convert_type(clipped, jnp.int32)
  sorted_c = lax.bitcast_convert_type(lax.sort(bits), jnp.float32)
  interior = sorted_c[positions]
  return jnp.concatenate([jnp.zeros((1,), jnp.float32), interior, jnp.ones((1,), jnp.float32)])


def bin_index(c: jax.Array, edges: jax.Array) -> jax.Array:
  """Bin of each confidence: ``j`` with ``e_j <= c < e_{j+1}`` (the last bin closed)."""
  if edges.shape[0] == 2:
    return jnp.zeros(c.shape, jnp.int32)
  return jnp.searchsorted(edges[1:-1], c, side="right").astype(jnp.int32)


def width_edges(num_bins: int) -> jax.Array:
  """The ``num_bins + 1`` equal-width edges ``float32(j) / float32(num_bins)``."""
  return _edges(jnp.zeros((1,), jnp.float32), num_bins, "width")


class _BinSums(NamedTuple):
  edges: jax.Array
  count: jax.Array      # int32 [B]
  sum_conf: jax.Array   # [B]
  sum_correct: jax.Array  # [B]
  sum_gap: jax.Array    # [B] sum of (confidence - correct)


def _bin_sums(c: jax.Array, k: jax.Array, num_bins: int, binning: str) -> _BinSums:
  edges = _edges(c, num_bins, binning)
  index = bin_index(c, edges)
  columns = (c, k, c - k)
  if num_bins <= _ONE_HOT_MAX_BINS:
    one_hot = index[:, None] == jnp.arange(num_bins, dtype=jnp.int32)[None, :]
    count = jnp.sum(one_hot, axis=0, dtype=jnp.int32)
    sums = [jnp.sum(jnp.where(one_hot, col[:, None], 0.0), axis=0) for col in columns]
  else:
    count = jax.ops.segment_sum(jnp.ones_like(index), index, num_segments=num_bins)
    sums = [jax.ops.segment_sum(col, index, num_segments=num_bins) for col in columns]
  return _BinSums(edges, count, *sums)


@functools.partial(jax.jit, static_argnames=("num_bins", "binning"))
def _bins_impl(c, k, *, num_bins, binning):
  s = _bin_sums(c, k, num_bins, binning)
  safe = jnp.maximum(s.count, 1).astype(jnp.float32)
  empty = s.count == 0
  return CalibrationBins(
      s.edges, s.count,
      jnp.where(empty, jnp.nan, s.sum_conf / safe),
      jnp.where(empty, jnp.nan, s.sum_correct / safe))


@functools.partial(jax.jit, static_argnames=("num_bins", "norm", "binning"))
def _ece_impl(c, k, *, num_bins, norm, binning):
  s = _bin_sums(c, k, num_bins, binning)
  n = c.shape[0]
  safe = jnp.maximum(s.count, 1).astype(jnp.float32)
  gap = s.sum_gap / safe  # conf_b - acc_b; 0 for an empty bin
  if norm == "l1":
    return jnp.sum(jnp.abs(s.sum_gap)) / n
  if norm == "l2":
    return jnp.sqrt(jnp.sum(s.sum_gap * gap) / n)
  return jnp.max(jnp.abs(gap))


def calibration_bins(confidences: Any, correct: Any, *, num_bins: int = 15,
                     binning: str = "width") -> CalibrationBins:
  r"""Per-bin count, mean confidence and accuracy (a reliability diagram).

  .. math::
    n_b = |B_b|,\quad \mathrm{conf}_b = \frac{1}{n_b}\sum_{i \in B_b} c_i,\quad
    \mathrm{acc}_b = \frac{1}{n_b}\sum_{i \in B_b} \kappa_i

  with the bins ``B_b`` of the module docstring.

  Args:
    confidences: [..., n] confidences in [0, 1]; leading axes are batch axes.
    correct: [..., n] boolean / 0-1 correctness or graded correctness in [0, 1].
    num_bins: number of bins ``B >= 1`` (static).
    binning: ``"width"`` (equal width, default) or ``"mass"`` (equal count,
      ties kept together).

  Returns:
    :class:`CalibrationBins` with ``edges`` [..., B + 1] and ``count``,
    ``mean_confidence``, ``accuracy`` [..., B] (NaN for empty bins).

  Examples:
    >>> from cwsa_jax._calibration import calibration_bins
    >>> b = calibration_bins([0.2, 0.4, 0.5, 1.0], [False, True, True, True], num_bins=2)
    >>> print(b.count.tolist(), [round(float(x), 3) for x in b.mean_confidence])
    [2, 2] [0.3, 0.75]
  """
  _check_options(num_bins, binning)
  c, k, invalid = _prepare(confidences, correct)
  fn = functools.partial(_bins_impl, num_bins=int(num_bins), binning=binning)
  return _validation.poison(_batched(fn, c.ndim)(c, k), rows=invalid)


def ece(confidences: Any, correct: Any, *, num_bins: int = 15, norm: str = "l1",
        binning: str = "width") -> jax.Array:
  r"""Binned top-label calibration error: ECE (l1), RMS calibration error (l2) or MCE (max).

  .. math::
    \mathrm{ECE} = \sum_b \frac{n_b}{n}\,|\mathrm{conf}_b - \mathrm{acc}_b|,\quad
    \mathrm{RMSCE} = \sqrt{\sum_b \frac{n_b}{n}(\mathrm{conf}_b - \mathrm{acc}_b)^2},\quad
    \mathrm{MCE} = \max_{b:\,n_b > 0} |\mathrm{conf}_b - \mathrm{acc}_b|

  The l1 form is computed as ``sum_b |sum_{i in b} (c_i - kappa_i)| / n``, a sum
  of small signed quantities. Empty bins contribute nothing (and are skipped
  by the max).

  Args:
    confidences: [..., n] confidences in [0, 1]; leading axes are batch axes.
    correct: [..., n] boolean / 0-1 correctness or graded correctness in [0, 1].
    num_bins: number of bins ``B >= 1`` (static). Default 15.
    norm: ``"l1"`` (ECE, default), ``"l2"`` (RMS) or ``"max"`` (MCE).
    binning: ``"width"`` (default; last bin closed so 1.0 counts) or
      ``"mass"`` (equal count; tied confidences never split).

  Returns:
    float32 of shape [...] (a scalar for 1-D inputs), in [0, 1].

  Examples:
    >>> from cwsa_jax._calibration import ece
    >>> c, ok = [0.25, 0.25, 0.55, 0.75, 0.75], [0, 0, 1, 1, 1]
    >>> print([round(float(ece(c, ok, num_bins=2, norm=p)), 4) for p in ("l1", "l2", "max")])
    [0.29, 0.2918, 0.3167]

  References:
    Naeini et al., "Obtaining well calibrated probabilities using Bayesian
    binning", AAAI 2015; Guo et al., "On calibration of modern neural
    networks", ICML 2017.
  """
  _check_options(num_bins, binning, norm)
  c, k, invalid = _prepare(confidences, correct)
  fn = functools.partial(_ece_impl, num_bins=int(num_bins), norm=norm, binning=binning)
  return _validation.poison(_batched(fn, c.ndim)(c, k), rows=invalid)
