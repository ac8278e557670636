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

Float64 confidences (concrete) are binned in float64 (``_threshold_order``):
width edges ``j / B`` and mass edges ``s_{ceil(j n / B)}`` taken in float64,
with the same rule ``e_j <= c < e_{j+1}``, through float32 stand-ins (one ulp
away for width bins, at most B - 1 ulp for mass bins where float32 would merge
two bins). The reported ``edges`` stay float32.

Exactness and speed: the per-bin count, ``sum kappa`` and ``sum (1 - c)`` are
exact integer sums (``_exact``; ``1 - c`` is a multiple of 2^-24 in float32),
and each reported quantity, the signed gap ``sum_b (c - kappa)`` included, is
rounded to float32 once from them, so results stay within a few float32 ulp
of the float64 definition at any n, and ``streaming.CalibrationState`` gives
the same values bit for bit (it runs the same :func:`bin_sums`). A sample's
bin costs a few fused comparisons and the sums one integer scatter-add per
column over cache-sized chunks (on CUDA GPUs, a Pallas kernel that sums
the same integers, ``_dense``); equal-mass edges are order statistics found
by a radix select (``_sort.order_statistics``, two histogram passes, no
sort). Faster than NumPy's ``np.bincount`` (and ``np.partition``) on CPU,
see ``benchmarks/bench_vs_numpy.py``.

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

from cwsa_jax._kernels import _dense
from cwsa_jax._kernels import _dispatch
from cwsa_jax import _exact
from cwsa_jax import _public
from cwsa_jax._kernels import _sort
from cwsa_jax import _stats
from cwsa_jax import _threshold_order
from cwsa_jax import _validation

NORMS = ("l1", "l2", "max")
BINNINGS = ("width", "mass")
# Up to this many interior edges a sample's bin is a sum of comparisons with
# every edge (fused, vectorized); above it a search.
_COMPARE_MAX_EDGES = 32
# Samples per chunk of the exact per-bin sums: small enough that their buffers stay in cache
# (the fastest of the powers of two measured, docs/performance.md).
_CHUNK_SIZE = 1 << 14


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


def _float64_bins(c64: np.ndarray, arguments: dict) -> np.ndarray | None:
  """float32 stand-ins of float64 confidences that fall in their float64 bins (None: options
  the checks refuse, or a single bin)."""
  num_bins, binning = arguments["num_bins"], arguments["binning"]
  if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)) \
      or num_bins <= 1 or binning not in BINNINGS:
    return None
  if binning == "width":
    return _threshold_order.stand_ins(c64, _threshold_order.width_edges(int(num_bins)),
                                      name="bin edges")
  return _threshold_order.mass_stand_ins(c64, int(num_bins))


def _check_options(num_bins: Any, binning: str, norm: str | None = None) -> None:
  if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)):
    raise ValueError(f"num_bins must be an int >= 1, got {num_bins!r}")
  if num_bins < 1:
    raise ValueError(f"num_bins must be >= 1, got {num_bins}")
  if binning not in BINNINGS:
    raise ValueError(f"binning must be one of {BINNINGS}, got {binning!r}")
  if norm is not None and norm not in NORMS:
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")


def _prepare(confidences: Any, correct: Any, *, check_confidences: bool = True,
             kernels: _dispatch.Kernels = _dispatch.DEFAULT):
  c, k, invalid = _validation.samples(confidences, correct, check_confidences=check_confidences,
                                      kernels=kernels)
  if k.dtype != jnp.bool_ and _validation.is_concrete(k):
    v = np.asarray(k)
    if np.all((v == 0.0) | (v == 1.0)):
      k = jnp.asarray(v == 1.0)  # 0/1 floats take the binary layout (same sums, half the columns)
  return c, k, invalid


def _batched(fn, ndim: int):
  for _ in range(ndim - 1):
    fn = jax.vmap(fn)
  return fn


def _width_edges_numpy(num_bins: int) -> np.ndarray:
  # Built in NumPy: XLA on CPU divides through a reciprocal, which is not
  # correctly rounded, and a confidence equal to an edge must compare equal.
  return np.arange(num_bins + 1, dtype=np.float32) / np.float32(num_bins)


def _edges(c: jax.Array, num_bins: int, binning: str,
           kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> jax.Array:
  if binning == "width":
    return jnp.asarray(_width_edges_numpy(num_bins))
  n = c.shape[0]
  # ceil(j n / B) in exact integer arithmetic (n and B are static).
  positions = [-(-j * n // num_bins) for j in range(1, num_bins)]
  # Non-negative float32 order like their int32 bit patterns (below 2^30 for
  # c <= 1): integer order statistics by radix select (_sort), no sort.
  interior = _sort.order_statistics(_sort.float_key(c), positions, key_bits=30, kernels=kernels)
  interior = lax.bitcast_convert_type(interior, jnp.float32)
  return jnp.concatenate([jnp.zeros((1,), jnp.float32), interior, jnp.ones((1,), jnp.float32)])


def bin_index(c: jax.Array, edges: jax.Array) -> jax.Array:
  """Bin of each confidence: ``j`` with ``e_j <= c < e_{j+1}`` (the last bin closed).

  Few bins: the number of interior edges at or below ``c`` (one fused pass of
  comparisons, the fastest form on CPU and GPU); many: a binary search.
  """
  interior = edges[1:-1]
  if interior.shape[0] > _COMPARE_MAX_EDGES:
    return jnp.searchsorted(interior, c, side="right").astype(jnp.int32)
  index = jnp.zeros(c.shape, jnp.int32)
  for j in range(interior.shape[0]):
    index = index + (c >= interior[j]).astype(jnp.int32)
  return index


def width_edges(num_bins: int) -> jax.Array:
  """The ``num_bins + 1`` equal-width edges ``float32(j) / float32(num_bins)``."""
  return jnp.asarray(_width_edges_numpy(num_bins))


def bin_sums(confidences: jax.Array, correct: jax.Array, edges: jax.Array,
             mask: jax.Array | None = None, *, drop_invalid: bool = False,
             kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> tuple[jax.Array, jax.Array]:
  """Exact per-bin sums: int32 ``(hi, lo)`` [B, _stats.CALIBRATION_COLUMNS].

  The one binning pipeline of :func:`ece`, :func:`calibration_bins` and
  ``streaming.CalibrationState`` (so they agree bit for bit): each chunk of
  samples gets its bins (:func:`bin_index`) and the integer columns of
  ``_stats.calibration_columns`` (binary correctness: 3 columns, the count
  split by correctness and the two 12-bit digits of ``1 - c``; graded: 6),
  summed by one 1-D scatter-add per column (``_exact.segment_sums``; on the
  CPU the count rides in the last column, one scatter-add fewer; on CUDA
  GPUs, binary samples in at most ``_dense.MAX_BUCKETS`` bins without a mask:
  ``_dense``'s kernel, the same integers), then brought to the canonical
  layout. ``mask`` False leaves a sample out, and so does ``drop_invalid`` a
  confidence NaN or outside [0, 1] (without, such a confidence is binned as
  it compares). ``kernels`` picks the forms.
  """
  num_bins = edges.shape[0] - 1
  graded = correct.dtype != jnp.bool_
  num_segments = _stats.calibration_segments(num_bins, graded)

  def columns_fn(c, k, *keep):
    ids, cols = _stats.calibration_columns(c, k, bin_index(c, edges))
    if keep:
      ids = jnp.where(keep[0], ids, num_segments)  # out of range: dropped
    if drop_invalid:
      ids = jnp.where(_validation.bad_unit(c), num_segments, ids)
    return ids, cols

  arrays = [confidences, correct] + ([] if mask is None else [mask])
  scatter = lambda *arrays: _exact.segment_sums(  # noqa: E731
      columns_fn, arrays, num_segments, chunk_size=_CHUNK_SIZE, counted=True, kernels=kernels)
  if (mask is None and confidences.ndim == 1
      and _dense.applies(confidences, correct, num_bins, kernels=kernels)):
    per_bin = lambda c, k, _: tuple(x.reshape(num_bins, -1) for x in scatter(c, k))  # noqa: E731
    hi, lo = kernels.pick("dense", confidences, correct, edges[1:-1],
                          cuda=functools.partial(_dense.bucket_sums, unit=drop_invalid,
                                                 kernels=kernels),
                          default=per_bin)
    hi, lo = hi.reshape(num_segments, -1), lo.reshape(num_segments, -1)
  else:
    hi, lo = scatter(*arrays)
  return _stats.calibration_canonical(hi, lo, graded)


@jax.custom_jvp
def bin_totals(confidences: jax.Array, correct: jax.Array, edges: jax.Array,
               hi: jax.Array, lo: jax.Array) -> _stats.BinTotals:
  """Per-bin totals of the exact sums ``(hi, lo)`` of these samples, with their derivative.

  The totals are exact integers rounded once, so autodiff alone would give 0.
  With the bins fixed (locally constant in c), ``sum c``, ``sum kappa`` and
  the gap are linear in the samples: the tangent is the float sum of
  ``(dkappa, dc, dc - dkappa)`` over each bin.
  """
  del confidences, correct, edges
  return _stats.calibration_totals(hi, lo)


@bin_totals.defjvp
def _bin_totals_jvp(primals, tangents):
  confidences, correct, edges, hi, lo = primals
  out = _stats.calibration_totals(hi, lo)
  dc = tangents[0].astype(jnp.float32)
  if correct.dtype == jnp.bool_:
    dk = jnp.zeros_like(dc)
  else:
    dk = tangents[1].astype(jnp.float32)
  index = bin_index(confidences, edges)
  per_bin = jax.ops.segment_sum(jnp.stack([dk, dc, dc - dk], axis=-1), index,
                                num_segments=edges.shape[0] - 1)
  return out, _stats.BinTotals(jnp.zeros_like(out.count), per_bin[:, 0], per_bin[:, 1],
                               per_bin[:, 2])


def error_from_totals(t: _stats.BinTotals, norm: str) -> jax.Array:
  """ECE (l1), RMS calibration error (l2) or MCE (max) of per-bin totals [B]."""
  n = jnp.sum(t.count)
  safe = jnp.maximum(t.count, 1.0)
  if norm == "l1":
    return jnp.sum(jnp.abs(t.gap)) / n
  gap = t.gap / safe  # conf_b - acc_b; 0 for an empty bin
  if norm == "l2":
    return jnp.sqrt(jnp.sum(t.gap * gap) / n)
  return jnp.max(jnp.abs(gap))


def bins_from_totals(edges: jax.Array, count: jax.Array, t: _stats.BinTotals) -> CalibrationBins:
  """:class:`CalibrationBins` of per-bin totals [B] and the exact int32 ``count``."""
  safe = jnp.maximum(t.count, 1.0)
  empty = count == 0
  return CalibrationBins(edges, count, jnp.where(empty, jnp.nan, t.confidence / safe),
                         jnp.where(empty, jnp.nan, t.correct / safe))


def exact_count(hi: jax.Array, lo: jax.Array, top: jax.Array | None = None) -> jax.Array:
  """int32 per-bin counts of canonical sums [..., B, CALIBRATION_COLUMNS] (``top``: a state's
  wide sums; a count of 2^31 or more, which int32 cannot hold, is -1)."""
  if top is None:
    return _exact.to_int(hi[..., 0], lo[..., 0])
  fits = (top[..., 0] == 0) & (hi[..., 0] < 1 << 19)
  return jnp.where(fits, _exact.to_int(hi[..., 0] & ((1 << 19) - 1), lo[..., 0]), -1)


@functools.partial(jax.jit, static_argnames=("num_bins", "binning", "drop_invalid", "kernels"))
def _bins_impl(c, k, *, num_bins, binning, drop_invalid, kernels):
  """(bins, samples binned) of one row."""
  edges = _edges(c, num_bins, binning, kernels)
  hi, lo = bin_sums(c, k, edges, drop_invalid=drop_invalid, kernels=kernels)
  count = exact_count(hi, lo)
  return bins_from_totals(edges, count, bin_totals(c, k, edges, hi, lo)), jnp.sum(count)


@functools.partial(jax.jit,
                   static_argnames=("num_bins", "norm", "binning", "drop_invalid", "kernels"))
def _ece_impl(c, k, *, num_bins, norm, binning, drop_invalid, kernels):
  """(calibration error, samples binned) of one row."""
  edges = _edges(c, num_bins, binning, kernels)
  hi, lo = bin_sums(c, k, edges, drop_invalid=drop_invalid, kernels=kernels)
  return error_from_totals(bin_totals(c, k, edges, hi, lo), norm), jnp.sum(exact_count(hi, lo))


def _checked_run(impl, confidences: Any, correct: Any, *,
                 kernels: _dispatch.Kernels = _dispatch.DEFAULT, **options):
  """``impl`` (:func:`_bins_impl` or :func:`_ece_impl`) over the batch axes, inputs checked,
  with these ``kernels`` (the internal entry point of :func:`ece` and :func:`calibration_bins`).

  Concrete confidences on an accelerator are checked by the count of samples
  binned rather than by a pass of their own before the bins
  (``_validation.deferred_to_kernel``): the bins leave out a confidence NaN
  or outside [0, 1], and a row that lost any raises the error a check
  beforehand gives.
  """
  deferred = _validation.deferred_to_kernel(confidences, kernels=kernels)
  c, k, invalid = _prepare(confidences, correct, check_confidences=not deferred, kernels=kernels)
  fn = functools.partial(impl, drop_invalid=deferred, kernels=kernels, **options)
  out, binned = _batched(fn, c.ndim)(c, k)
  if deferred:
    _validation.raise_if_left_out(np.asarray(binned) != c.shape[-1], c, kernels=kernels)
  return _validation.poison(out, rows=invalid)


@_threshold_order.kept(_float64_bins)
@_public.entry
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
    >>> from cwsa_jax import calibration_bins
    >>> b = calibration_bins([0.2, 0.4, 0.5, 1.0], [False, True, True, True], num_bins=2)
    >>> print(b.count.tolist(), [round(float(x), 3) for x in b.mean_confidence])
    [2, 2] [0.3, 0.75]
  """
  return _calibration_bins(confidences, correct, num_bins=num_bins, binning=binning)


def _calibration_bins(confidences: Any, correct: Any, *, num_bins: int = 15,
                      binning: str = "width",
                      kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> CalibrationBins:
  """:func:`calibration_bins` with these ``kernels`` (the internal entry point)."""
  _check_options(num_bins, binning)
  return _checked_run(_bins_impl, confidences, correct, kernels=kernels, num_bins=int(num_bins),
                      binning=binning)


@_threshold_order.kept(_float64_bins)
@_public.entry
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
    >>> from cwsa_jax import ece
    >>> c, ok = [0.25, 0.25, 0.55, 0.75, 0.75], [0, 0, 1, 1, 1]
    >>> print([round(float(ece(c, ok, num_bins=2, norm=p)), 4) for p in ("l1", "l2", "max")])
    [0.29, 0.2918, 0.3167]

  References:
    Naeini et al., "Obtaining well calibrated probabilities using Bayesian
    binning", AAAI 2015; Guo et al., "On calibration of modern neural
    networks", ICML 2017.
  """
  return _ece(confidences, correct, num_bins=num_bins, norm=norm, binning=binning)


def _ece(confidences: Any, correct: Any, *, num_bins: int = 15, norm: str = "l1",
         binning: str = "width", kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> jax.Array:
  """:func:`ece` with these ``kernels`` (the internal entry point)."""
  _check_options(num_bins, binning, norm)
  return _checked_run(_ece_impl, confidences, correct, kernels=kernels, num_bins=int(num_bins),
                      norm=norm, binning=binning)
