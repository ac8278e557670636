"""The best vectorized NumPy (and torch CPU) implementation of each cwsa_jax kernel, for the benchmarks.

Each function computes what the kit's function of the same name computes, with
the kit's conventions (the docstrings of ``cwsa_jax/_calibration.py``,
``_risk_coverage.py``, ``_sweep.py``, ``_selective.py``, ``_groups.py``,
``_select.py`` and ``_bootstrap.py``), as fast as plain vectorized NumPy goes:

* calibration: the bin of ``c`` is ``floor(c B)`` corrected by one comparison
  with the float32 edges ``float32(j) / float32(B)`` each way (the last bin
  closed), then ``np.bincount``; equal-mass edges come from one
  ``np.partition`` (order statistics, no full sort);
* the risk-coverage family: one ``np.sort`` of a packed int32 key
  ``confidence bits << 1 | error`` (the bits of a float32 in [0, 1] order like
  its value), reversed, then a cumsum and the tie-group ends;
  ``"published_code"`` sorts an int64 key that also holds the input position
  (ties in input order, as the kit's stable sort); E-AURC's oracle is closed
  form;
* the sweep: each sample's threshold bucket from a cell table (``floor(c 2^k)``
  is exact, so only the thresholds inside a sample's own cell need a
  comparison), then two ``np.bincount`` (counts split by correctness, sums of
  ``c``) and a reverse cumsum over the T + 1 buckets: O(n), flat in T;
* the bootstrap: samples bucketed (or sorted) once and ordered by segment; a
  resample is a vector of multiplicities (``np.bincount`` of n uniform random
  indices, drawn directly over the segment-sorted samples, which has the same
  distribution) reduced per segment with ``np.add.reduceat``: no re-sort and no
  gather of the data per resample. AURC's bootstrap works on one sorted order.

Counts are exact integers and sums are float64, so these double as the float64
references the benchmarks check the kit against; ``tests/test_benchmarks.py``
checks them against the slow references of ``tests/reference.py``.

The ``torch_*`` functions (torch CPU: ``torch.bincount``, ``torch.sort``,
``torch.bucketize``) need torch (``HAVE_TORCH``; imported on first use by
:func:`load_torch`). Inputs: torch tensors from ``torch.from_numpy``; outputs:
NumPy.
"""

from __future__ import annotations

import importlib.util
import warnings
from typing import NamedTuple

import numpy as np

# torch is optional and slow to import: only the torch_* baselines need it.
HAVE_TORCH = importlib.util.find_spec("torch") is not None
torch = None


def load_torch():
  """The torch module, imported on first use (also bound to this module's ``torch``)."""
  global torch
  if torch is None:
    import torch as module
    torch = module
  return torch


class Bins(NamedTuple):
  """Per-bin statistics, as ``cwsa_jax.CalibrationBins``."""
  edges: np.ndarray
  count: np.ndarray
  mean_confidence: np.ndarray
  accuracy: np.ndarray


class Areas(NamedTuple):
  """AURC, AUGRC and E-AURC of one convention (E-AURC NaN when not asked for)."""
  aurc: float
  augrc: float
  eaurc: float


class Curve(NamedTuple):
  """Tie-grouped risk-coverage curve padded to n, as ``cwsa_jax.RiskCoverageCurve``."""
  thresholds: np.ndarray
  coverage: np.ndarray
  risk: np.ndarray
  generalized_risk: np.ndarray
  num_points: int


class Sweep(NamedTuple):
  """The sweep's metrics, each [..., T], as ``cwsa_jax.SweepResult`` (without ``thresholds``)."""
  coverage: np.ndarray
  selective_accuracy: np.ndarray
  cwsa: np.ndarray
  cwsa_plus: np.ndarray


class Choice(NamedTuple):
  """As ``cwsa_jax.ThresholdChoice``."""
  threshold: float
  coverage: float
  selective_risk: float
  value: float


class Interval(NamedTuple):
  """As ``cwsa_jax.BootstrapResult``: the estimate and the percentile bounds."""
  estimate: object
  low: object
  high: object


# --------------------------------------------------------------------------- inputs


def as_f32(x) -> np.ndarray:
  """Confidences as a contiguous float32 array (the kit computes on float32)."""
  return np.ascontiguousarray(x, dtype=np.float32)


def as_correct(correct) -> np.ndarray:
  """bool for boolean or integer 0/1 correctness, float64 for graded correctness."""
  k = np.asarray(correct)
  if k.dtype == np.bool_:
    return k
  if np.issubdtype(k.dtype, np.integer):
    return k != 0
  return k.astype(np.float64)


def as_binary(correct) -> np.ndarray:
  """Boolean correctness; floats must be 0/1 (the rank metrics' fast path)."""
  k = as_correct(correct)
  if k.dtype != np.bool_:
    if not np.all((k == 0.0) | (k == 1.0)):
      raise ValueError("the risk-coverage baselines need boolean (0/1) correctness")
    k = k == 1.0
  return k


def confidence_bits(c: np.ndarray) -> np.ndarray:
  """int32 bit patterns of float32 confidences in [0, 1]: they order like the values.

  The sign bit is dropped, so -0.0 becomes 0 (as the kit's ``_sort.float_key``).
  """
  return as_f32(c).view(np.int32) & np.int32(0x7FFFFFFF)


# --------------------------------------------------------------------------- binning


def width_edges(num_bins: int) -> np.ndarray:
  """The kit's equal-width edges ``float32(j) / float32(num_bins)``, j = 0..B."""
  return np.arange(num_bins + 1, dtype=np.float32) / np.float32(num_bins)


def width_bins(c: np.ndarray, num_bins: int) -> np.ndarray:
  """Bin j of each confidence with ``e_j <= c < e_{j+1}`` (the last bin closed).

  ``floor(c B)`` in float32 is within one bin of the answer (the product and the
  edges are each rounded once), so one comparison with the edge below and one
  with the edge above fix it.
  """
  edges = width_edges(num_bins)
  index = (c * np.float32(num_bins)).astype(np.intp)  # truncation = floor for c >= 0
  np.minimum(index, num_bins - 1, out=index)
  index -= c < edges[index]
  upper = np.append(edges[1:num_bins], np.float32(np.inf))  # e_{j+1}; the last bin is closed
  index += c >= upper[index]
  return index


def mass_edges(c: np.ndarray, num_bins: int) -> np.ndarray:
  """Equal-mass edges: 0, the order statistics ``s_{ceil(j n / B)}`` (j = 1..B-1), 1.

  ``np.partition`` finds the B - 1 order statistics without sorting. A position
  past the end (n < B) is clamped to n - 1, as JAX's gather does.
  """
  n = c.shape[0]
  positions = np.minimum([-(-j * n // num_bins) for j in range(1, num_bins)], n - 1).astype(np.intp)
  interior = np.zeros(0, np.float32)
  if positions.size:
    interior = np.partition(c, positions)[positions] + np.float32(0.0)  # + 0.0: -0.0 becomes 0.0
  return np.concatenate([[np.float32(0.0)], interior, [np.float32(1.0)]]).astype(np.float32)


def bucketize(c: np.ndarray, sorted_thresholds: np.ndarray, *, max_steps: int = 4) -> np.ndarray:
  """Number of sorted thresholds <= each confidence (its bucket in [0, T]), exactly.

  A table over ``cells`` equal cells of [0, 1] (a power of two >= 4T, so
  ``floor(x * cells)`` is exact and monotone) gives the number of thresholds in
  the cells below a sample's own; then each of the at most ``max per cell``
  steps compares the sample with the next threshold (a threshold in a higher
  cell is always larger, so the walk stops by itself). A grid with more than
  ``max_steps`` thresholds in one cell falls back to ``np.searchsorted``.
  Confidences and thresholds must lie in [0, 1].
  """
  t = as_f32(sorted_thresholds)
  if t.size == 0:
    return np.zeros(c.shape, np.intp)
  cells = min(max(64, 1 << (4 * t.size - 1).bit_length()), 1 << 20)
  scale = np.float32(cells)
  per_cell = np.bincount((t * scale).astype(np.intp), minlength=cells + 1)  # x = 1 lands in cell `cells`
  steps = int(per_cell.max())
  if steps > max_steps:
    return np.searchsorted(t, c, side="right")
  below = np.concatenate([[0], np.cumsum(per_cell)[:-1]])
  bucket = below[(c * scale).astype(np.intp)]
  padded = np.append(t, np.float32(np.inf))
  for _ in range(steps):
    bucket += padded[bucket] <= c
  return bucket


# --------------------------------------------------------------------------- calibration


def _bin_index(c: np.ndarray, num_bins: int, binning: str):
  if binning == "width":
    return width_edges(num_bins), width_bins(c, num_bins)
  if binning != "mass":
    raise ValueError(f"binning must be 'width' or 'mass', got {binning!r}")
  edges = mass_edges(c, num_bins)
  return edges, bucketize(c, edges[1:-1])


def ece(confidences, correct, *, num_bins: int = 15, norm: str = "l1", binning: str = "width",
        gap_dtype=np.float64) -> float:
  """ECE (l1), RMS calibration error (l2) or MCE (max), as ``cwsa_jax.ece``.

  ``sum_b |sum_{i in b} (c_i - kappa_i)| / n`` (l1) needs one weighted
  ``np.bincount`` of the per-sample gaps; l2 and max add the bin counts.
  ``gap_dtype=np.float32`` is faster and rounds ``c - 1`` for ``c < 0.5``
  (by at most 2^-25 per sample).
  """
  c = as_f32(confidences)
  k = as_correct(correct)
  n = c.shape[0]
  _, index = _bin_index(c, num_bins, binning)
  gap = np.subtract(c, k, dtype=gap_dtype)
  sum_gap = np.bincount(index, weights=gap, minlength=num_bins)
  if norm == "l1":
    return float(np.abs(sum_gap).sum() / n)
  count = np.bincount(index, minlength=num_bins)
  mean_gap = sum_gap / np.maximum(count, 1)
  if norm == "l2":
    return float(np.sqrt(np.dot(sum_gap, mean_gap) / n))
  if norm == "max":
    return float(np.abs(mean_gap[count > 0]).max())
  raise ValueError(f"norm must be 'l1', 'l2' or 'max', got {norm!r}")


def calibration_bins(confidences, correct, *, num_bins: int = 15, binning: str = "width") -> Bins:
  """Per-bin count, mean confidence and accuracy (NaN for empty bins), as ``cwsa_jax.calibration_bins``."""
  c = as_f32(confidences)
  k = as_correct(correct)
  edges, index = _bin_index(c, num_bins, binning)
  if k.dtype == np.bool_:
    split = np.bincount(index * 2 + k, minlength=2 * num_bins).reshape(num_bins, 2)
    count, sum_correct = split.sum(axis=1), split[:, 1]
  else:
    count = np.bincount(index, minlength=num_bins)
    sum_correct = np.bincount(index, weights=k, minlength=num_bins)
  sum_conf = np.bincount(index, weights=c, minlength=num_bins)
  with np.errstate(invalid="ignore", divide="ignore"):
    empty = count == 0
    mean_conf = np.where(empty, np.nan, sum_conf / count)
    accuracy = np.where(empty, np.nan, sum_correct / count)
  return Bins(edges, count, mean_conf, accuracy)


# --------------------------------------------------------------------------- risk-coverage


def sorted_outcomes(confidences, correct, *, keep_input_order: bool = False):
  """(confidence bits, error flags), both sorted by decreasing confidence, from one sort.

  Tie-grouped conventions: one ``np.sort`` of the int32 key
  ``bits << 1 | error``. ``keep_input_order``: one ``np.sort`` of the int64 key
  ``bits << 33 | (n - 1 - i) << 1 | error``, so equal confidences come out in
  input order (the "published_code" convention's stable sort).
  """
  bits = confidence_bits(confidences)
  error = ~as_binary(correct)
  if keep_input_order:
    n = bits.shape[0]
    key = bits.astype(np.int64) << 33
    key |= np.arange(n - 1, -1, -1, dtype=np.int64) << 1
    key |= error
    key.sort()
    descending = key[::-1]
    return (descending >> 33).astype(np.int32), (descending & 1).astype(np.int32)
  key = bits << 1
  key |= error
  key.sort()
  descending = key[::-1]
  return descending >> 1, descending & 1


def _group_ends(bits_desc: np.ndarray) -> np.ndarray:
  """0-based positions of the last sample of each tie group (sorted order)."""
  ends = np.flatnonzero(bits_desc[1:] != bits_desc[:-1])
  return np.append(ends, bits_desc.shape[0] - 1)


def oracle_aurc(num_errors: int, n: int, convention: str) -> float:
  """The smallest AURC any scoring of ``num_errors`` errors among n reaches, per convention.

  "step" / "published_code": every correct sample first, strictly ordered, so
  ``E_k = max(k - m, 0)`` (m correct); "trapezoid": all correct tied above all
  errors tied, area ``0.5 err^2``.
  """
  m = n - num_errors
  if convention == "trapezoid":
    return 0.5 * (num_errors / n) ** 2
  k = np.arange(m + 1, n + 1, dtype=np.float64)
  total = float(np.sum((k - m) / k))  # sum_k E_k / k over k = m + 1..n (E_k = 0 before)
  if convention == "published_code":
    if n == 1:
      return 0.0
    first = 1.0 if m == 0 else 0.0  # E_1 / 1
    total -= 0.5 * (first + num_errors / n)  # trapezoid weights 1/2 at k = 1 and k = n
  return total / n


def risk_coverage_areas(confidences, correct, *, convention: str = "step",
                        with_eaurc: bool = True) -> Areas:
  """AURC, AUGRC and E-AURC of one convention from one sort, as ``cwsa_jax.risk_coverage_summary``."""
  if convention not in ("step", "trapezoid", "published_code"):
    raise ValueError(f"unknown convention {convention!r}")
  bits, error = sorted_outcomes(confidences, correct,
                                keep_input_order=convention == "published_code")
  n = bits.shape[0]
  cum = np.cumsum(error, dtype=np.int64)
  num_errors = int(cum[-1])
  if convention == "published_code":
    k = np.arange(1, n + 1, dtype=np.float64)
    risk_sum = float(np.sum(cum / k))
    cum_sum = float(cum.sum())
    ends_risk = cum[0] / 1.0 + cum[-1] / n
    ends_cum = float(cum[0] + cum[-1])
    aurc = (risk_sum - 0.5 * ends_risk) / n if n > 1 else 0.0
    augrc = (cum_sum - 0.5 * ends_cum) / n / n if n > 1 else 0.0
  else:
    ends = _group_ends(bits)
    covered = (ends + 1).astype(np.float64)  # k_j
    errors = cum[ends].astype(np.float64)  # E_{k_j}
    width = np.diff(covered, prepend=0.0)
    risk = errors / covered
    if convention == "step":
      aurc = float(np.dot(width, risk)) / n
      augrc = float(np.dot(width, errors)) / n / n
    else:
      previous_risk = np.concatenate([risk[:1], risk[:-1]])
      previous_errors = np.concatenate([[0.0], errors[:-1]])
      aurc = float(np.dot(width, risk + previous_risk)) / 2 / n
      augrc = float(np.dot(width, errors + previous_errors)) / 2 / n / n
  eaurc = float("nan")
  if with_eaurc:
    eaurc = 0.0 if num_errors in (0, n) else max(aurc - oracle_aurc(num_errors, n, convention), 0.0)
  return Areas(float(aurc), float(augrc), float(eaurc))


def aurc(confidences, correct, *, convention: str = "step") -> float:
  """As ``cwsa_jax.aurc``."""
  return risk_coverage_areas(confidences, correct, convention=convention, with_eaurc=False).aurc


def augrc(confidences, correct, *, convention: str = "step") -> float:
  """As ``cwsa_jax.augrc``."""
  return risk_coverage_areas(confidences, correct, convention=convention, with_eaurc=False).augrc


def eaurc(confidences, correct, *, convention: str = "step") -> float:
  """AURC minus the same convention's oracle in float64, clamped at 0 (``cwsa_jax.eaurc`` sums the
  exact nonnegative differences instead, so the two agree to float32 rounding)."""
  return risk_coverage_areas(confidences, correct, convention=convention).eaurc


def _pad(values: np.ndarray, n: int) -> np.ndarray:
  out = np.full(n, values[-1], dtype=values.dtype)
  out[:values.shape[0]] = values
  return out


def risk_coverage_curve(confidences, correct) -> Curve:
  """One point per distinct confidence, padded to n with the last point, as ``cwsa_jax.risk_coverage_curve``."""
  bits, error = sorted_outcomes(confidences, correct)
  n = bits.shape[0]
  cum = np.cumsum(error, dtype=np.int64)
  ends = _group_ends(bits)
  covered = (ends + 1).astype(np.float64)
  errors = cum[ends].astype(np.float64)
  thresholds = bits[ends].view(np.float32)
  return Curve(_pad(thresholds, n), _pad(covered / n, n), _pad(errors / covered, n),
               _pad(errors / n, n), int(ends.shape[0]))


# --------------------------------------------------------------------------- sweep


def _sorted_thresholds(thresholds):
  t = as_f32(thresholds).reshape(-1)
  order = np.argsort(t, kind="stable")
  return t, order, t[order]


def sweep_from_bucket_sums(count, correct, sum_c, sum_ck, sorted_t, order, size,
                           normalize: str = "retained") -> Sweep:
  """The sweep's metrics from per-bucket sums [..., T + 1] (float64 or integer).

  Bucket b holds the samples with exactly b sorted thresholds <= c; the
  retained set of sorted threshold j is buckets j + 1..T, summed by a reverse
  cumsum. With N, A, C, C_k the retained count, correct count, sum of c and
  sum of c kappa: sum phi = (C - tau N)/(1 - tau), sum phi kappa =
  (C_k - tau A)/(1 - tau). ``size`` is n ([...] or a scalar: the group size).
  Results come back in the user's threshold order.
  """
  if normalize not in ("retained", "all"):
    raise ValueError(f"normalize must be 'retained' or 'all', got {normalize!r}")

  def retained(x):
    suffix = np.cumsum(np.asarray(x, np.float64)[..., ::-1], axis=-1)[..., ::-1]
    return suffix[..., 1:]

  n_ret, a_ret, c_ret, ck_ret = (retained(x) for x in (count, correct, sum_c, sum_ck))
  tau = sorted_t.astype(np.float64)
  size = np.asarray(size, np.float64)[..., None]
  with np.errstate(invalid="ignore", divide="ignore"):
    sum_phi = (c_ret - tau * n_ret) / (1.0 - tau)
    sum_phi_k = (ck_ret - tau * a_ret) / (1.0 - tau)
    nonempty = n_ret > 0
    safe = np.where(nonempty, n_ret, 1.0)
    cwsa_denominator = safe if normalize == "retained" else size
    fields = (
        n_ret / size,
        np.where(nonempty, a_ret / safe, np.nan),
        np.where(nonempty, (2.0 * sum_phi_k - sum_phi) / cwsa_denominator, 0.0),
        np.where(nonempty, sum_phi_k / safe, 0.0),
    )
  inverse = np.empty_like(order)
  inverse[order] = np.arange(order.shape[0])
  return Sweep(*(f[..., inverse] for f in fields))


def _segment_sums(segment: np.ndarray, c: np.ndarray, k: np.ndarray, num_segments: int):
  """Per segment (count, correct, sum c, sum c kappa) from 2 bincounts (binary) or 4 (graded)."""
  if k.dtype == np.bool_:
    split = segment * 2 + k
    counts = np.bincount(split, minlength=2 * num_segments).reshape(num_segments, 2)
    sums = np.bincount(split, weights=c, minlength=2 * num_segments).reshape(num_segments, 2)
    return counts.sum(axis=1), counts[:, 1], sums.sum(axis=1), sums[:, 1]
  return (np.bincount(segment, minlength=num_segments),
          np.bincount(segment, weights=k, minlength=num_segments),
          np.bincount(segment, weights=c, minlength=num_segments),
          np.bincount(segment, weights=c * k, minlength=num_segments))


def sweep(confidences, correct, thresholds, *, normalize: str = "retained",
          bucketing: str = "table") -> Sweep:
  """Coverage, selective accuracy, CWSA and CWSA+ at every threshold, as ``cwsa_jax.sweep``.

  ``confidences`` [n] or [M, n] (M models: one bincount over model-offset
  segments, no Python loop). ``bucketing``: ``"table"`` (:func:`bucketize`)
  or ``"searchsorted"`` (``np.searchsorted``, a binary search per sample).
  """
  c = as_f32(confidences)
  k = as_correct(correct)
  _, order, sorted_t = _sorted_thresholds(thresholds)
  num_buckets = sorted_t.shape[0] + 1
  if bucketing == "table":
    bucket = bucketize(c.reshape(-1), sorted_t)
  elif bucketing == "searchsorted":
    bucket = np.searchsorted(sorted_t, c.reshape(-1), side="right")
  else:
    raise ValueError(f"bucketing must be 'table' or 'searchsorted', got {bucketing!r}")
  if c.ndim == 2:
    bucket = bucket.reshape(c.shape)
    bucket += (np.arange(c.shape[0]) * num_buckets)[:, None]
  lead = c.shape[:-1]
  sums = _segment_sums(bucket.reshape(-1), c.reshape(-1), k.reshape(-1),
                       num_buckets * int(np.prod(lead, dtype=np.int64)))
  sums = [s.reshape(*lead, num_buckets) for s in sums]
  return sweep_from_bucket_sums(*sums, sorted_t, order, c.shape[-1], normalize)


def sweep_loop_over_models(confidences, correct, thresholds, *, normalize: str = "retained") -> Sweep:
  """:func:`sweep` of each model (row) in a Python loop, stacked: the "NumPy loop over models"."""
  rows = [sweep(ci, ki, thresholds, normalize=normalize) for ci, ki in zip(confidences, correct)]
  return Sweep(*(np.stack(f) for f in zip(*rows)))


def sweep_per_threshold_loop(confidences, correct, thresholds, *, normalize: str = "retained") -> Sweep:
  """The obvious float64 loop: one masked pass per threshold (a second column, never a headline)."""
  c = as_f32(confidences).astype(np.float64)
  k = np.asarray(as_correct(correct), np.float64)
  n = c.shape[0]
  out = np.zeros((4, len(thresholds)))
  for j, tau in enumerate(as_f32(thresholds).astype(np.float64)):
    mask = c >= tau
    count = int(mask.sum())
    if count == 0:
      out[:, j] = (0.0, np.nan, 0.0, 0.0)
      continue
    phi = (c[mask] - tau) / (1.0 - tau)
    kj = k[mask]
    out[:, j] = (count / n, kj.mean(), np.sum(phi * (2 * kj - 1)) / (count if normalize == "retained" else n),
                 np.mean(phi * kj))
  return Sweep(*out)


def sweep_by_group(confidences, correct, groups, thresholds, *, num_groups: int,
                   normalize: str = "retained") -> Sweep:
  """The sweep of every group [G, T] from one bincount, as ``cwsa_jax.sweep_by_group``.

  Coverage is relative to the group's size; ``normalize="all"`` divides CWSA
  by the group's size; an empty group is NaN throughout.
  """
  c = as_f32(confidences)
  k = as_correct(correct)
  _, order, sorted_t = _sorted_thresholds(thresholds)
  num_buckets = sorted_t.shape[0] + 1
  segment = np.asarray(groups, np.intp) * num_buckets
  segment += bucketize(c, sorted_t)
  sums = [s.reshape(num_groups, num_buckets)
          for s in _segment_sums(segment, c, k, num_groups * num_buckets)]
  size = sums[0].sum(axis=1)
  result = sweep_from_bucket_sums(*sums, sorted_t, order, np.maximum(size, 1), normalize)
  empty = (size == 0)[:, None]
  return Sweep(*(np.where(empty, np.nan, f) for f in result))


def default_thresholds() -> np.ndarray:
  """The kit's default grid for ``select_threshold``: 0.50, 0.51, ..., 0.99 in float32."""
  return (np.arange(50, dtype=np.float64) / 100.0 + 0.5).astype(np.float32)


def select_threshold(confidences, correct, *, metric: str = "cwsa", min_coverage=None,
                     max_risk=None, thresholds=None, slack: float = 1e-6) -> Choice:
  """The grid threshold maximising ``metric`` under the constraints, as ``cwsa_jax.select_threshold``.

  Same rules: nothing retained is infeasible, constraints hold within
  ``slack``, ties (equal float32 values) go to the smallest threshold.
  """
  t = default_thresholds() if thresholds is None else as_f32(thresholds)
  r = sweep(confidences, correct, t)
  risk = 1.0 - r.selective_accuracy
  value = getattr(r, metric)
  feasible = r.coverage > 0
  if min_coverage is not None:
    feasible &= r.coverage >= min_coverage - slack
  if max_risk is not None:
    with np.errstate(invalid="ignore"):
      feasible &= risk <= max_risk + slack
  if not feasible.any():
    raise ValueError("no threshold satisfies the constraints")
  candidates = np.flatnonzero(feasible)
  best = np.float32(value[candidates].max())
  winners = candidates[value[candidates].astype(np.float32) == best]
  j = winners[np.argmin(t[winners])]
  return Choice(float(t[j]), float(r.coverage[j]), float(risk[j]), float(value[j]))


# --------------------------------------------------------------------------- bootstrap


def _quantiles(samples: np.ndarray, level: float):
  """NumPy's default (linear) quantiles over axis 0, NaN left out, as the kit's ``_percentiles``."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices give NaN, as in the kit
    low, high = np.nanquantile(samples, [(1.0 - level) / 2.0, (1.0 + level) / 2.0], axis=0)
  return low, high


class _Segments(NamedTuple):
  """Samples ordered so that each segment is contiguous."""
  order: np.ndarray | None  # sorted position -> original index (None: already in order)
  starts: np.ndarray  # first sorted position of each non-empty segment
  ids: np.ndarray  # the segment id of each start


def _segments(segment: np.ndarray) -> _Segments:
  order = np.argsort(segment, kind="stable")
  ordered = segment[order]
  starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
  return _Segments(order, starts, ordered[starts])


def _resampled_sums(seg: _Segments, weights: list, num_segments: int, num_resamples: int, n: int,
                    *, rng, indices, chunk_size: int = 32):
  """Per resample and segment: the multiplicity count and the weighted sums of ``weights``.

  ``weights`` are per-sample arrays already in sorted (segment) order. A
  resample's multiplicities are ``np.bincount`` of n uniform positions: drawn
  directly over the sorted samples (``rng``), or, to reproduce given resamples,
  the original ``indices`` [B, n] mapped to sorted positions. Segment sums are
  ``np.add.reduceat`` over the contiguous segments, a chunk of resamples at a time.
  Returns counts [B, S] and sums [B, S, len(weights)].
  """
  counts = np.zeros((num_resamples, num_segments), np.int64)
  sums = np.zeros((num_resamples, num_segments, len(weights)))
  for b0, chunk_counts, chunk_sums in _resampled_chunks(seg, weights, num_resamples, n, rng=rng,
                                                        indices=indices, chunk_size=chunk_size):
    rows = chunk_counts.shape[0]
    counts[b0:b0 + rows, seg.ids] = chunk_counts
    sums[b0:b0 + rows, seg.ids] = chunk_sums
  return counts, sums


def _resampled_chunks(seg: _Segments, weights: list, num_resamples: int, n: int, *, rng,
                      indices, chunk_size: int = 32):
  """:func:`_resampled_sums` a chunk of resamples at a time, over the non-empty segments only:
  yields ``(b0, counts [rows, S'], sums [rows, S', len(weights)])`` (segment order of
  ``seg.starts``), so that a caller reducing each resample to a few numbers never holds
  [B, S] arrays (for AURC, S is about n)."""
  inverse = None
  if indices is not None:
    inverse = np.empty(n, np.intp)
    inverse[seg.order] = np.arange(n)
  multiplicities = np.empty((min(chunk_size, num_resamples), n), np.int64)
  for b0 in range(0, num_resamples, chunk_size):
    rows = min(chunk_size, num_resamples - b0)
    for r in range(rows):
      pos = rng.integers(0, n, n) if indices is None else inverse[indices[b0 + r]]
      multiplicities[r] = np.bincount(pos, minlength=n)
    m = multiplicities[:rows]
    sums = np.stack([np.add.reduceat(m * w, seg.starts, axis=1) for w in weights], axis=-1)
    yield b0, np.add.reduceat(m, seg.starts, axis=1), sums


def bootstrap_sweep(confidences, correct, thresholds, *, num_resamples: int = 1000,
                    level: float = 0.95, normalize: str = "retained", seed: int = 0,
                    indices=None) -> Interval:
  """Percentile bootstrap of a whole sweep, as ``cwsa_jax.bootstrap_sweep`` (boolean correctness).

  Buckets once; per resample only multiplicities and segment sums (see
  :func:`_resampled_sums`). ``indices`` [B, n] reproduces given resamples
  (e.g. the kit's); otherwise ``np.random.default_rng(seed)`` draws them.
  """
  c = as_f32(confidences)
  k = as_binary(correct)
  n = c.shape[0]
  _, order, sorted_t = _sorted_thresholds(thresholds)
  num_buckets = sorted_t.shape[0] + 1
  segment = bucketize(c, sorted_t) * 2 + k
  estimate_sums = _segment_sums(segment >> 1, c, k, num_buckets)
  estimate = sweep_from_bucket_sums(*estimate_sums, sorted_t, order, n, normalize)
  seg = _segments(segment)
  if indices is not None:
    num_resamples = len(indices)
  counts, sums = _resampled_sums(seg, [c[seg.order]], 2 * num_buckets, num_resamples, n,
                                 rng=np.random.default_rng(seed), indices=indices)
  counts = counts.reshape(num_resamples, num_buckets, 2)
  sums = sums.reshape(num_resamples, num_buckets, 2)
  samples = sweep_from_bucket_sums(counts.sum(-1), counts[..., 1], sums.sum(-1), sums[..., 1],
                                   sorted_t, order, n, normalize)
  bounds = [_quantiles(f, level) for f in samples]
  return Interval(estimate, Sweep(*(b[0] for b in bounds)), Sweep(*(b[1] for b in bounds)))


def bootstrap_ece(confidences, correct, *, num_bins: int = 15, num_resamples: int = 1000,
                  level: float = 0.95, seed: int = 0, indices=None) -> Interval:
  """Percentile bootstrap of the equal-width l1 ECE: bins once, resamples as multiplicities."""
  c = as_f32(confidences)
  k = as_binary(correct)
  n = c.shape[0]
  index = width_bins(c, num_bins)
  estimate = ece(c, k, num_bins=num_bins)
  seg = _segments(index * 2 + k)
  if indices is not None:
    num_resamples = len(indices)
  counts, sums = _resampled_sums(seg, [c[seg.order]], 2 * num_bins, num_resamples, n,
                                 rng=np.random.default_rng(seed), indices=indices)
  counts = counts.reshape(num_resamples, num_bins, 2)
  sum_c = sums.reshape(num_resamples, num_bins, 2).sum(-1)
  samples = np.abs(sum_c - counts[..., 1]).sum(-1) / n
  low, high = _quantiles(samples, level)
  return Interval(estimate, float(low), float(high))


def bootstrap_aurc(confidences, correct, *, convention: str = "step", num_resamples: int = 1000,
                   level: float = 0.95, seed: int = 0, indices=None) -> Interval:
  """Percentile bootstrap of AURC ("step" or "trapezoid") over one sorted order.

  The samples are sorted once; a resample only reweights the tie groups: with
  W_j the resampled size of group j and E_j, K_j the cumulative errors and
  count at its end, step AURC = sum_j W_j E_j / K_j / n (a group drawn 0 times
  drops out; the trapezoid's previous point is (K_j - W_j, E_j - errors_j)).
  """
  if convention not in ("step", "trapezoid"):
    raise ValueError("bootstrap_aurc covers the tie-grouped conventions 'step' and 'trapezoid'")
  c = as_f32(confidences)
  k = as_binary(correct)
  n = c.shape[0]
  estimate = aurc(c, k, convention=convention)
  key = (confidence_bits(c) << 1) | ~k
  if indices is None:
    order = None
    descending = np.sort(key)[::-1]
  else:
    order = np.argsort(key, kind="stable")[::-1]
    descending = key[order]
    num_resamples = len(indices)
  bits, error = descending >> 1, (descending & 1).astype(np.float64)
  starts = np.flatnonzero(np.concatenate([[True], bits[1:] != bits[:-1]]))
  seg = _Segments(order, starts, np.arange(starts.shape[0]))
  samples = np.empty(num_resamples)
  # A few resamples at a time: each reduces to one number, and [B, groups] arrays (about
  # B n values) would not fit in any cache.
  for b0, counts, sums in _resampled_chunks(seg, [error], num_resamples, n,
                                            rng=np.random.default_rng(seed), indices=indices,
                                            chunk_size=4):
    width = counts.astype(np.float64)
    group_errors = sums[..., 0]
    covered = np.cumsum(width, axis=1)
    errors = np.cumsum(group_errors, axis=1)
    risk = np.divide(errors, covered, out=np.zeros_like(errors), where=covered > 0)
    if convention == "trapezoid":
      before = covered - width
      previous = np.divide(errors - group_errors, before, out=risk.copy(), where=before > 0)
      risk = (risk + previous) / 2
    samples[b0:b0 + width.shape[0]] = np.sum(width * risk, axis=1) / n
  low, high = _quantiles(samples, level)
  return Interval(estimate, float(low), float(high))


# --------------------------------------------------------------------------- torch CPU


def torch_ece(confidences, correct, *, num_bins: int = 15, norm: str = "l1") -> float:
  """Equal-width ECE with torch: floor + edge fix as :func:`width_bins`, ``torch.bincount`` (float64)."""
  load_torch()
  c = confidences
  edges = torch.from_numpy(width_edges(num_bins))
  upper = torch.from_numpy(np.append(width_edges(num_bins)[1:num_bins], np.float32(np.inf)))
  index = (c * num_bins).long().clamp_(max=num_bins - 1)
  index -= (c < edges[index]).long()
  index += (c >= upper[index]).long()
  gap = c.double() - correct.double()
  sum_gap = torch.bincount(index, weights=gap, minlength=num_bins)
  n = c.shape[0]
  if norm == "l1":
    return float(sum_gap.abs().sum() / n)
  count = torch.bincount(index, minlength=num_bins).double()
  mean_gap = sum_gap / count.clamp(min=1)
  if norm == "l2":
    return float(torch.sqrt(torch.dot(sum_gap, mean_gap) / n))
  return float(mean_gap[count > 0].abs().max())


def torch_risk_coverage_areas(confidences, correct, *, convention: str = "step",
                              with_eaurc: bool = True) -> Areas:
  """:func:`risk_coverage_areas` with ``torch.sort`` of the same packed keys and torch cumsums."""
  load_torch()
  c, ok = confidences, correct
  n = c.shape[0]
  bits = c.view(torch.int32) & 0x7FFFFFFF
  error = (~ok).to(torch.int32)
  if convention == "published_code":
    key = (bits.long() << 33) | (torch.arange(n - 1, -1, -1, dtype=torch.int64) << 1) | error.long()
    descending = torch.sort(key).values.flip(0)
    bits, error = descending >> 33, descending & 1
  else:
    descending = torch.sort((bits << 1) | error).values.flip(0)
    bits, error = descending >> 1, descending & 1
  cum = torch.cumsum(error, 0, dtype=torch.int64)
  num_errors = int(cum[-1])
  if convention == "published_code":
    k = torch.arange(1, n + 1, dtype=torch.float64)
    cumf = cum.double()
    aurc_value = float(((cumf / k).sum() - 0.5 * (cumf[0] + cumf[-1] / n)) / n) if n > 1 else 0.0
    augrc_value = float((cumf.sum() - 0.5 * (cumf[0] + cumf[-1])) / n / n) if n > 1 else 0.0
  else:
    ends = torch.nonzero(bits[1:] != bits[:-1]).squeeze(1)
    ends = torch.cat([ends, torch.tensor([n - 1])])
    covered = (ends + 1).double()
    errors = cum[ends].double()
    width = torch.diff(covered, prepend=torch.zeros(1, dtype=torch.float64))
    risk = errors / covered
    if convention == "step":
      aurc_value = float(torch.dot(width, risk)) / n
      augrc_value = float(torch.dot(width, errors)) / n / n
    else:
      previous_risk = torch.cat([risk[:1], risk[:-1]])
      previous_errors = torch.cat([torch.zeros(1, dtype=torch.float64), errors[:-1]])
      aurc_value = float(torch.dot(width, risk + previous_risk)) / 2 / n
      augrc_value = float(torch.dot(width, errors + previous_errors)) / 2 / n / n
  eaurc_value = float("nan")
  if with_eaurc:
    eaurc_value = (0.0 if num_errors in (0, n)
                   else max(aurc_value - oracle_aurc(num_errors, n, convention), 0.0))
  return Areas(aurc_value, augrc_value, eaurc_value)


def torch_sweep(confidences, correct, thresholds, *, normalize: str = "retained") -> Sweep:
  """The sweep with ``torch.bucketize`` (binary search) and two ``torch.bincount`` (float64 sums)."""
  load_torch()
  t, order, sorted_t = _sorted_thresholds(thresholds)
  num_buckets = sorted_t.shape[0] + 1
  c, ok = confidences, correct
  bucket = torch.bucketize(c, torch.from_numpy(sorted_t), right=True)
  split = bucket * 2 + ok.long()
  counts = torch.bincount(split, minlength=2 * num_buckets).reshape(num_buckets, 2).numpy()
  sums = torch.bincount(split, weights=c.double(), minlength=2 * num_buckets)
  sums = sums.reshape(num_buckets, 2).numpy()
  return sweep_from_bucket_sums(counts.sum(1), counts[:, 1], sums.sum(1), sums[:, 1], sorted_t,
                                order, c.shape[0], normalize)
