"""``cwsa-jax evaluate --stream``: CSV and Parquet predictions read in chunks, with exact results.

Memory is bounded by the chunk (``--chunk-rows``) and by the rows one exact-AURC pass
sorts (:data:`DEFAULT_SORT_ROWS`, 4 bytes each), not by the files:

* **Pass 1** reads every file once, chunk by chunk, into the mergeable states of
  :mod:`cwsa_jax.streaming`: a :class:`~cwsa_jax.streaming.SweepState` on the
  settings' threshold grid (coverage, selective accuracy, CWSA, CWSA+ from exact
  integer sums: the in-memory :func:`~cwsa_jax.sweep`, bit for bit, and from it
  AUMCC and the deployment threshold), a
  :class:`~cwsa_jax.streaming.CalibrationState` (ECE family and reliability bins,
  equal-width bins) and the count of correct rows (accuracy). Where some
  confidence of the files is not a float32 value, the sweep compares them with the
  grid's decimals and the ECE puts them in bins in float64, as the in-memory
  ``evaluate`` does; files of float32 values give the float32 states, as before
  (:func:`scan`). It also builds a
  histogram of :func:`~cwsa_jax.streaming.confidence_key` (the bins of a
  :class:`~cwsa_jax.streaming.RiskCoverageState`, ``2^8`` per octave): per bin the
  row count, the errors and the smallest and largest key, as exact integers; and the
  smooth ECE's mesh sums (:func:`mesh_sums`, float64, additive over chunks).
* **Pass 2** (and more if needed) makes AURC, AUGRC and E-AURC exact. A bin whose
  rows share one confidence (smallest key = largest key) is one tie group, known
  from pass 1. The other bins are taken in descending confidence order, as many
  as hold at most a budget of rows (:data:`DEFAULT_SORT_ROWS`; a bin holding more
  is a pass of its own, and all its rows are held); a pass re-reads the files,
  keeps the keys and error bits of those bins' rows, sorts them into the exact tie
  groups (each distinct confidence with its count and errors), and adds their
  area terms, a slice of groups at a time. Every tie
  group's accepted count and errors *before* it are the exact prefix sums of
  pass 1's histogram plus the groups before it in its own bin, so the passes are
  independent. Area terms are summed in float64 and give the in-memory
  :func:`~cwsa_jax.risk_coverage_summary` (``"step"`` or ``"trapezoid"``) to its
  float32 precision. The same tie groups give AUROC, FPR@95%TPR and both average
  precisions exactly (:class:`~cwsa_jax.cli._metrics.RankSums`: integer sums, each group
  on its own, so the order of the passes does not matter), bit for bit the in-memory values.
  The keys are float32's: float64 confidences that float32 rounds to one value are one
  tie group here, where the in-memory ``evaluate`` orders them in float64.

* **Bootstrap intervals** (Poisson resampling only): the bins are taken in
  descending confidence order again, all of them, as many as hold at most
  :data:`BOOTSTRAP_RANGE_ROWS` rows per pass; a pass keeps those rows'
  confidences, correctness and row numbers (their position in the files, in
  order) and adds them to a
  :class:`~cwsa_jax._bootstrap.StreamedEvaluationBootstrap`: every row gets the
  Poisson multiplicities the in-memory ``evaluate`` gives it, so the intervals are
  the in-memory ones (to float32 rounding of the area sums). The peer metrics (AUROC,
  FPR@95%TPR, the average precisions, smooth ECE) get null intervals with a note: that
  bootstrap does not resample them.

Everything that needs all rows at once is refused with one line (``--binning
mass``, ``--worst``, ``--group-by``, ``--aurc published_code``, whose tie order is
the input order, and ``--resampling multinomial``) or left out with a note (the
per-class breakdown). A file that changes between passes is an error, and
nothing is written unless every pass succeeded.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import jax
import numpy as np

import cwsa_jax as cw
from cwsa_jax import (_areas, _bootstrap, _calibration, _smooth_ece, _threshold_order,
                      streaming)
from cwsa_jax._states import _risk_coverage_state
from cwsa_jax.cli import _figures, _intervals, _io, _metrics
from cwsa_jax.cli._settings import Settings
from cwsa_jax.cli._util import UserError, progress_bar

DEFAULT_CHUNK_ROWS = 1 << 18
# Rows whose keys one refinement pass holds and sorts (4 bytes each: 64 MiB); their tie groups
# are then summed GROUP_SLICE rows at a time. The environment variable (not documented) lets
# tests force several passes.
DEFAULT_SORT_ROWS = 1 << 24
GROUP_SLICE = 1 << 18
SORT_ROWS_ENV = "CWSA_JAX_STREAM_SORT_ROWS"
MANTISSA_BITS = 8
_SHIFT = 23 - MANTISSA_BITS
_NUM_BINS = _risk_coverage_state.num_rc_bins(MANTISSA_BITS)
# Rows one bootstrap pass holds (about 40 bytes each while their resamples run).
BOOTSTRAP_RANGE_ROWS = 1 << 21


# --------------------------------------------------------------------------
# Reading the files, chunk by chunk, once per pass
# --------------------------------------------------------------------------


class _Shard(NamedTuple):
  """One input file as pass 1 saw it: its rows, size and modification time."""
  path: Path
  rows: int
  size: int
  mtime_ns: int


def _stat(path: Path) -> tuple[int, int]:
  try:
    st = os.stat(path)
  except OSError as e:
    raise UserError(f"{path}: cannot read: {e.strerror or e}") from None
  return st.st_size, st.st_mtime_ns


def _changed(path: Path | str, what: str) -> UserError:
  return UserError(f"{path}: changed between the passes of --stream ({what}); keep the inputs "
                   "unchanged while cwsa-jax reads them, or drop --stream")


def _blocks(paths: list[Path], chunk_rows: int, bar: Any, shards: list[_Shard] | None,
            seen: list[_Shard], labels: list) -> Iterator[tuple[Path, np.ndarray, np.ndarray]]:
  """(file, float64 confidences as read, bool correct) of every chunk of every file, in order.

  Pass 1 (``shards`` None) records each file in ``seen`` and the class-label kind of the first
  file in ``labels``, and refuses a file whose columns differ from the first's; later passes
  check each file against pass 1's ``shards`` (size, modification time, rows).
  """
  for i, path in enumerate(paths):
    size, mtime = _stat(path)
    if shards is not None and (size, mtime) != (shards[i].size, shards[i].mtime_ns):
      raise _changed(path, "its size or modification time differs")
    rows = 0
    for chunk in _io.iter_table_chunks(path, chunk_rows):
      if rows == 0 and shards is None:
        _check_columns(path, _io.chunk_labels(chunk), paths[0], labels)
      rows += chunk.confidences.size
      bar.update(chunk.confidences.size)
      yield path, chunk.confidences, chunk.correct
    if shards is not None and rows != shards[i].rows:
      raise _changed(path, f"{rows} rows now, {shards[i].rows} on the first pass")
    seen.append(_Shard(path, rows, size, mtime))


def _check_columns(path: Path, kind: str | None, first: Path, labels: list) -> None:
  if not labels:
    labels.append(kind)
  elif kind != labels[0]:
    raise _io.different_columns(path, _io.table_schema(kind), first, _io.table_schema(labels[0]))


def _padded(c: np.ndarray, ok: np.ndarray, chunk_rows: int):
  """The chunk padded to a power of two rows (or ``chunk_rows``), and its mask: few shapes,
  so few compilations of the state kernels."""
  m = c.size
  size = max(m, min(chunk_rows, 1 << max(m - 1, 0).bit_length()))
  mask = np.arange(size) < m
  return np.pad(c, (0, size - m)), np.pad(ok, (0, size - m)), mask


_confidence_key = jax.jit(streaming.confidence_key)


def _keys(c: np.ndarray, chunk_rows: int) -> np.ndarray:
  """int32 :func:`~cwsa_jax.streaming.confidence_key` of each confidence (as float32)."""
  padded, _, _ = _padded(np.asarray(c, np.float32), np.zeros(c.shape, bool), chunk_rows)
  return np.asarray(_confidence_key(padded))[:c.size]


# --------------------------------------------------------------------------
# Pass 1: the states and the key histogram
# --------------------------------------------------------------------------


class Histogram(NamedTuple):
  """Per confidence-key bin (ascending confidence), exact int64 counts and errors, and the
  smallest and largest int32 key (``INT32_MAX`` and -1 for an empty bin)."""
  counts: np.ndarray
  errors: np.ndarray
  key_min: np.ndarray
  key_max: np.ndarray

  @classmethod
  def empty(cls) -> "Histogram":
    zeros = np.zeros(_NUM_BINS, np.int64)
    return cls(zeros, zeros.copy(), np.full(_NUM_BINS, np.iinfo(np.int32).max, np.int32),
               np.full(_NUM_BINS, -1, np.int32))

  def add(self, keys: np.ndarray, ok: np.ndarray) -> None:
    bins = keys >> _SHIFT
    self.counts[:] += np.bincount(bins, minlength=_NUM_BINS)
    self.errors[:] += np.bincount(bins[~ok], minlength=_NUM_BINS)
    np.minimum.at(self.key_min, bins, keys)
    np.maximum.at(self.key_max, bins, keys)

  @property
  def refine(self) -> np.ndarray:
    """The bins holding several distinct confidences (pass 2 sorts their rows)."""
    return (self.counts > 0) & (self.key_min != self.key_max)

  def before(self) -> tuple[np.ndarray, np.ndarray]:
    """Rows and errors in the bins above each bin (more confident), exact int64."""
    rows = np.cumsum(self.counts[::-1])[::-1] - self.counts
    errors = np.cumsum(self.errors[::-1])[::-1] - self.errors
    return rows, errors


class Scan(NamedTuple):
  """What pass 1 gathers over every file."""
  shards: list[_Shard]
  labels: str | None  # the class labels the files hold (io.chunk_labels)
  n: int
  num_correct: int
  sweep: streaming.SweepState
  calibration: streaming.CalibrationState  # float64 bins where wide, else float32's
  histogram: Histogram
  mesh: np.ndarray  # float64 [2, L + 1]: the smooth ECE's mesh sums (mesh_sums)
  wide: bool = False  # some confidence is not a float32 value: compared in float64


def mesh_sums(c: np.ndarray, ok: np.ndarray) -> np.ndarray:
  """float64 [2, L + 1] residuals ``c - kappa`` and counts spread onto the smooth ECE's mesh
  by linear interpolation (``_smooth_ece._mesh_sums``: the same float32 shares of each row).

  The sums are additive over chunks; float64 keeps them near the exact sums, where the
  in-memory float32 scatter-add rounds at each row (the smooth ECE agrees to float32 rounding).
  """
  size = _smooth_ece._MESH_INTERVALS
  c = np.asarray(c, np.float32)
  x = c * np.float32(size)
  cell = np.clip(np.floor(x), 0, size - 1)
  frac = x - cell
  cell = cell.astype(np.int64)
  out = np.zeros((2, size + 1))
  for row, weight in enumerate((c - np.asarray(ok, np.float32), np.ones_like(c))):
    out[row] += np.bincount(cell, weight * (np.float32(1) - frac), minlength=size + 1)
    out[row] += np.bincount(cell + 1, weight * frac, minlength=size + 1)
  return out


def scan(paths: list[Path], settings: Settings, chunk_rows: int, *, show: bool = False,
         passes: int | None = None) -> Scan:
  """Pass 1 over ``paths``: the sweep and calibration states, accuracy and the key histogram.

  Whether the files are float64 (some confidence not a float32 value) is known only at
  the end, and float32 values next to a threshold or an edge fall on its other side in
  float64 (``float32(0.7) < 0.7``): both states are kept both ways, the float64 ones (the
  grid's decimals, ``_metrics.decimal_thresholds``, and edges ``j / B``) costing a second
  kernel only for chunks where the two differ.
  """
  sweep = streaming.SweepState.empty(settings.grid)
  calibration = streaming.CalibrationState.empty(settings.num_bins)
  sweep64, calibration64 = sweep, calibration
  grid64 = _metrics.decimal_thresholds(settings.grid)
  width = {"num_bins": settings.num_bins, "binning": "width"}
  histogram = Histogram.empty()
  mesh = np.zeros((2, _smooth_ece._MESH_INTERVALS + 1))
  shards, labels, num_correct, wide = [], [], 0, False
  with progress_bar(None, _pass_name(1, passes, "sweep, calibration, histogram"), enabled=show,
                    unit="row") as bar:
    for _, c64, ok in _blocks(paths, chunk_rows, bar, None, shards, labels):
      c = c64.astype(np.float32)
      float32_values = _io.float32_printed(c64)  # as evaluate reads the same files
      wide |= not float32_values
      cp, okp, mask = _padded(c, ok, chunk_rows)
      # The float64 comparisons as float32 stand-ins (_threshold_order), on the float32 grid.
      swept = lambda x: streaming.SweepState.from_batch(  # noqa: E731
          _padded(x, ok, chunk_rows)[0], okp, settings.grid, mask=mask)
      binned = lambda x: streaming.CalibrationState.from_batch(  # noqa: E731
          _padded(x, ok, chunk_rows)[0], okp, num_bins=settings.num_bins, mask=mask)
      chunk = swept(c)
      sweep = sweep.merge(chunk)
      stand_ins = _threshold_order.stand_ins(c64, grid64)
      sweep64 = sweep64.merge(chunk if np.array_equal(stand_ins, c) else swept(stand_ins))
      chunk = binned(c)
      calibration = calibration.merge(chunk)
      stand_ins = _calibration._float64_bins(c64, width)  # None for one bin
      if stand_ins is not None and not np.array_equal(stand_ins, c):
        chunk = binned(stand_ins)
      calibration64 = calibration64.merge(chunk)
      histogram.add(_keys(c, chunk_rows), ok)
      mesh += mesh_sums(c, ok)
      num_correct += int(np.count_nonzero(ok))
  return Scan(shards, labels[0], sum(s.rows for s in shards), num_correct,
              sweep64 if wide else sweep, calibration64 if wide else calibration, histogram,
              mesh, wide)


def _pass_name(index: int, total: int | None, what: str) -> str:
  return f"pass {index}{'' if total is None else f'/{total}'}: {what}"


# --------------------------------------------------------------------------
# Pass 2: exact AURC, AUGRC, E-AURC
# --------------------------------------------------------------------------


def plan(histogram: Histogram, budget: int, *, every_bin: bool = False) -> list[np.ndarray]:
  """The bins each refinement pass sorts (``every_bin``: each bootstrap pass holds), in
  descending confidence order: consecutive bins of at most ``budget`` rows together (a bin
  holding more is a pass of its own)."""
  passes, current, rows = [], [], 0
  which = histogram.counts > 0 if every_bin else histogram.refine
  for b in np.flatnonzero(which)[::-1]:
    count = int(histogram.counts[b])
    if current and rows + count > budget:
      passes.append(np.asarray(current))
      current, rows = [], 0
    current.append(b)
    rows += count
  if current:
    passes.append(np.asarray(current))
  return passes


class _Areas:
  """Running float64 sums of the area terms of tie groups, the integers E-AURC needs, and the
  exact sums of the order metrics (``ranks``: AUROC, FPR@95%TPR, both average precisions).

  Each tie group has ``count`` rows with ``errors`` errors and ``rows_before`` rows with
  ``errors_before`` errors above it (more confident); see :func:`cwsa_jax.aurc`.
  """

  def __init__(self, n: int, num_errors: int, convention: str):
    self.n, self.num_errors, self.convention = n, num_errors, convention
    self.num_correct = n - num_errors
    self.aurc = self.augrc = 0.0
    self.errors_first_m = self.starts_after_m = self.starts_at_m1 = self.groups = 0
    self.ranks = _metrics.RankSums(n, num_errors)

  def add(self, count: np.ndarray, errors: np.ndarray, rows_before: np.ndarray,
          errors_before: np.ndarray) -> None:
    w = count.astype(np.float64)
    rows = (rows_before + count).astype(np.float64)  # accepted at the group's end
    errs = (errors_before + errors).astype(np.float64)
    risk = errs / rows
    previous = None
    if self.convention == "trapezoid":  # the previous point's risk and generalized risk
      before = rows_before.astype(np.float64)
      previous = (rows_before > 0, errors_before / np.maximum(before, 1.0), errors_before)
    aurc, augrc = _areas.point_terms(w, risk, errs, self.convention, previous, xp=np)
    self.aurc += float(np.sum(aurc))
    self.augrc += float(np.sum(augrc))
    m = self.num_correct
    self.errors_first_m += int(errors[rows_before < m].sum())
    self.starts_after_m += int(np.count_nonzero(rows_before >= m))
    self.starts_at_m1 += int(np.count_nonzero(rows_before == m))
    self.groups += count.size
    self.ranks.add(count, errors, rows_before, errors_before)

  def summary(self) -> cw.RiskCoverageSummary:
    """AURC, AUGRC and E-AURC (float64), as :func:`cwsa_jax.risk_coverage_summary` defines them
    (the formulas of :mod:`cwsa_jax._areas`, in float64 on the host)."""
    n, m = self.n, self.num_correct
    aurc, augrc = _areas.areas(self.aurc, self.augrc, n, xp=np)
    if self.convention == "trapezoid":  # all correct tied above all errors tied
      oracle = _areas.trapezoid_oracle(self.num_errors, n, xp=np)
    else:  # a strict order with the correct first: sum over p > m of (p - m) / p
      oracle = _areas.step_oracle(self.num_errors, m, _areas.harmonic_difference_exact(m, n), n,
                                  xp=np)
    optimal = _areas.optimal_order(self.convention, n, m, self.errors_first_m,
                                   self.starts_after_m, self.starts_at_m1)
    eaurc = _areas.eaurc(aurc, oracle, _areas.one_class(self.num_errors, n) | optimal, xp=np)
    return cw.RiskCoverageSummary(np.float64(aurc), np.float64(augrc), np.float64(eaurc))


def tie_groups(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The distinct keys of sorted ``key << 1 | error`` values in descending order, with each
  key's row count and errors (int64)."""
  keys = packed >> 1
  starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
  counts = np.diff(np.append(starts, packed.size))
  errors = np.add.reduceat((packed & 1).astype(np.int64), starts)
  return keys[starts][::-1].astype(np.int64), counts[::-1], errors[::-1]


def _group_slices(packed: np.ndarray, size: int) -> Iterator[np.ndarray]:
  """Slices of about ``size`` sorted values, from the largest down, cut between tie groups."""
  end = packed.size
  while end > 0:
    start = max(0, end - size)
    if start > 0:  # back to the first value of the key at the cut
      start = int(np.searchsorted(packed, (packed[start] >> 1) << 1, side="left"))
    yield packed[start:end]
    end = start


def _refined_groups(areas: _Areas, before: tuple[np.ndarray, np.ndarray],
                    packed: np.ndarray, group_slice: int) -> None:
  """Adds the tie groups of a pass's rows (``key << 1 | error``, sorted here in place), a
  slice of about ``group_slice`` rows at a time: the rows and errors before a group are its bin's (pass 1) plus those of
  the groups above it in its bin (carried over from slice to slice)."""
  packed.sort()
  carry_bin, carry_rows, carry_errors = -1, 0, 0
  for part in _group_slices(packed, group_slice):
    keys, counts, errors = tie_groups(part)
    bins = keys >> _SHIFT
    first = np.flatnonzero(np.concatenate([[True], bins[1:] != bins[:-1]]))
    run = np.repeat(first, np.diff(np.append(first, bins.size)))  # each group's bin's first
    rows_in, errors_in = np.cumsum(counts) - counts, np.cumsum(errors) - errors
    rows_in, errors_in = rows_in - rows_in[run], errors_in - errors_in[run]
    carried = (run == 0) & (bins == carry_bin)  # the bin the previous slice ended in
    rows_in[carried] += carry_rows
    errors_in[carried] += carry_errors
    areas.add(counts, errors, before[0][bins] + rows_in, before[1][bins] + errors_in)
    carry_bin = bins[-1]
    carry_rows, carry_errors = rows_in[-1] + counts[-1], errors_in[-1] + errors[-1]


def exact_areas(paths: list[Path], result: Scan, convention: str, chunk_rows: int, *,
                budget: int = DEFAULT_SORT_ROWS, group_slice: int = GROUP_SLICE,
                show: bool = False) -> tuple[cw.RiskCoverageSummary, int, _Areas]:
  """AURC, AUGRC and E-AURC of the scanned files, exact; also the number of passes in all
  (pass 1 included) and the tie-group totals. A pass sorts at most ``budget`` rows (or one
  bin) and sums their tie groups ``group_slice`` rows at a time.

  Raises:
    UserError: a file changed since pass 1, or can no longer be read.
  """
  histogram = result.histogram
  areas = _Areas(result.n, result.n - result.num_correct, convention)
  before = histogram.before()
  single = (histogram.counts > 0) & ~histogram.refine
  areas.add(histogram.counts[single], histogram.errors[single], before[0][single],
            before[1][single])
  passes = plan(histogram, budget)
  for index, bins in enumerate(passes):
    take = np.zeros(_NUM_BINS, bool)
    take[bins] = True
    expected = int(histogram.counts[bins].sum())
    packed = np.empty(expected, np.uint32)  # key < 2^31: key << 1 | error fits
    filled = 0
    name = _pass_name(index + 2, len(passes) + 1, "exact AURC")
    with progress_bar(result.n, name, enabled=show, unit="row") as bar:
      for path, c, ok in _blocks(paths, chunk_rows, bar, result.shards, [], []):
        keys = _keys(c, chunk_rows)
        kept = take[keys >> _SHIFT]
        count = int(np.count_nonzero(kept))
        if filled + count > expected:
          raise _changed(path, "its confidences differ from the first pass")
        packed[filled:filled + count] = (keys[kept].astype(np.uint32) << 1) | ~ok[kept]
        filled += count
    if filled != expected:
      raise _changed(paths[0] if len(paths) == 1 else _io.inputs_name(paths),
                     "the confidences differ from the first pass")
    _refined_groups(areas, before, packed, group_slice)
    del packed
  return areas.summary(), len(passes) + 1, areas


def streamed_intervals(paths: list[Path], result: Scan, settings: Settings, chunk_rows: int,
                       args: argparse.Namespace, *, first_pass: int, budget: int,
                       show: bool = False) -> tuple[_intervals.Intervals, int]:
  """Poisson-bootstrap intervals of every metric, range by range; also the passes they took.

  Raises:
    UserError: a file changed since pass 1, or can no longer be read.
  """
  histogram = result.histogram
  boot = _bootstrap.StreamedEvaluationBootstrap(
      settings.grid, key=jax.random.key(args.seed), num_resamples=args.bootstrap,
      num_bins=settings.num_bins, ece_norm=settings.ece_norm,
      aurc_convention=settings.aurc_convention, normalize=settings.normalize)
  passes = plan(histogram, budget, every_bin=True)
  for index, bins in enumerate(passes):
    take = np.zeros(_NUM_BINS, bool)
    take[bins] = True
    expected = int(histogram.counts[bins].sum())
    # int64 row numbers: past 2^32 rows they stay exact (the resamples' draws depend on them).
    c, ok, rows = (np.empty(expected, dt) for dt in (np.float32, bool, np.int64))
    filled = offset = 0
    name = _pass_name(first_pass + index, None, f"bootstrap rows {index + 1}/{len(passes)}")
    with progress_bar(result.n, name, enabled=show, unit="row") as bar:
      for path, ci, oki in _blocks(paths, chunk_rows, bar, result.shards, [], []):
        ci = ci.astype(np.float32)  # the bootstrap resamples float32 confidences
        kept = np.flatnonzero(take[_keys(ci, chunk_rows) >> _SHIFT])
        if filled + kept.size > expected:
          raise _changed(path, "its confidences differ from the first pass")
        end = filled + kept.size
        c[filled:end], ok[filled:end], rows[filled:end] = ci[kept], oki[kept], kept + offset
        filled, offset = end, offset + ci.size
    if filled != expected:
      raise _changed(paths[0] if len(paths) == 1 else _io.inputs_name(paths),
                     "the confidences differ from the first pass")
    with progress_bar(args.bootstrap, f"bootstrap {index + 1}/{len(passes)}", enabled=show,
                      unit="resample") as bar, _bootstrap.reporting(bar.update):
      boot.add_range(c, ok, rows)
    del c, ok, rows
  r = boot.result(level=args.level)
  as_numpy = lambda m: _bootstrap.EvaluationMetrics(*map(np.asarray, m))  # noqa: E731
  return (_intervals.Intervals(args.level, args.bootstrap, args.seed, as_numpy(r.low),
                               as_numpy(r.high), "poisson"), len(passes))


# --------------------------------------------------------------------------
# The report from the states
# --------------------------------------------------------------------------


def _key_confidences(keys: np.ndarray) -> np.ndarray:
  """The float32 confidences of :func:`~cwsa_jax.streaming.confidence_key` values."""
  keys = np.asarray(keys, np.int32)
  high = np.float32(1.0) - (_risk_coverage_state.KEY_MAX - keys).astype(np.int32).view(np.float32)
  return np.where(keys < _risk_coverage_state.HALF_BITS, keys.view(np.float32), high)


def binned_curve(histogram: Histogram, n: int) -> cw.RiskCoverageCurve:
  """The risk-coverage curve at the ends of the histogram's non-empty bins (high to low): each
  point is an exact point of the curve; all of them when every bin holds one confidence."""
  nonempty = np.flatnonzero(histogram.counts > 0)[::-1]
  rows, errors = histogram.before()
  accepted = (rows + histogram.counts)[nonempty].astype(np.float64)
  errs = (errors + histogram.errors)[nonempty].astype(np.float64)
  return cw.RiskCoverageCurve(_key_confidences(histogram.key_min[nonempty]), accepted / n,
                              errs / accepted, errs / n, np.int32(nonempty.size))


def curve_caption(histogram: Histogram) -> str:
  """The risk-coverage figure's caption: exact, or drawn at the histogram's resolution."""
  refined = int(np.count_nonzero(histogram.refine))
  if not refined:
    return _figures.RISK_COVERAGE_CAPTION
  bins = int(np.count_nonzero(histogram.counts > 0))
  return (f"{_figures.RISK_COVERAGE_CAPTION[:-1]}, drawn from the streamed confidence "
          f"histogram (binned): one point per non-empty bin ({bins:,} bins, {2 ** MANTISSA_BITS} "
          f"per octave of c and of 1 − c); every point lies on the exact curve, but the "
          f"{refined:,} bins holding several distinct confidences are drawn as one step each. "
          "The AURC and AUGRC stated are exact.")


def stream_metrics(result: Scan, risk_coverage: cw.RiskCoverageSummary,
                   settings: Settings) -> _metrics.Metrics:
  """The report's :class:`~cwsa_jax.cli._metrics.Metrics` from the streamed states."""
  return _metrics.assemble_metrics(
      n=result.n, accuracy=np.float32(result.num_correct / result.n),
      ece=result.calibration.compute(norm=settings.ece_norm), risk_coverage=risk_coverage,
      result=result.sweep.compute(normalize=settings.normalize), settings=settings)


def stream_peers(result: Scan, areas: _Areas) -> _metrics.PeerMetrics:
  """The peer metrics from the streamed sums: the order metrics exact (the in-memory values,
  bit for bit), the smooth ECE from the mesh sums (to float32 rounding of those sums); no
  classwise ECE (CSV and Parquet hold no per-class probabilities)."""
  smooth = _metrics.smooth_ece_of_sums(np.asarray(result.mesh, np.float32))
  return areas.ranks.result()._replace(smooth_ece=np.float32(smooth))


def deployment(result: Scan, selection: Any, settings: Settings,
                select_on: str | None) -> _metrics.Deployment:
  """The deployment threshold: in-sample from the streamed sweep, or chosen on the (in-memory)
  ``selection`` and read off the streamed sweep at that grid threshold."""
  retained = result.sweep.compute(normalize="retained")
  if selection is None:
    return _metrics.choose_on_sweep(retained, settings)
  grid = settings.grid

  def evaluated_at(tau: float) -> _metrics.OperatingPoint:
    return _metrics.point_of_sweep(retained, int(np.flatnonzero(grid == np.float32(tau))[0]))

  return _metrics.choose_held_out((_io.compared_confidences(selection), selection.correct),
                                  None, None, settings, file=str(select_on),
                                  evaluated_at=evaluated_at)


# --------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------


def check_flags(args: argparse.Namespace, settings: Settings) -> int:
  """Refuses what --stream cannot do, in one line; returns the rows per chunk."""
  chunk_rows = DEFAULT_CHUNK_ROWS if args.chunk_rows is None else args.chunk_rows
  if chunk_rows < 1:
    raise UserError(f"--chunk-rows must be >= 1, got {chunk_rows}")
  needs_rows = [(settings.binning == "mass", "--binning mass (its bin edges are quantiles of "
                 "every confidence)"),
                (settings.aurc_convention == "published_code", "--aurc published_code (also "
                 "the default of --published-code; it orders tied rows by input position): pass "
                 "--aurc step or trapezoid"),
                (args.worst is not None, "--worst"), (args.group_by is not None, "--group-by"),
                (args.labels is not None, "--labels (it goes with .npy scores)")]
  for refused, flag in needs_rows:
    if refused:
      raise UserError(f"--stream cannot compute {flag}: it needs every row in memory; drop "
                      "--stream for it")
  _intervals.check_bootstrap_flags(args, allow_zero=True)
  if args.bootstrap and args.resampling == "multinomial":
    raise UserError("--stream cannot compute --resampling multinomial (a resample draws from "
                    "every row at once): use the default Poisson resampling or drop --stream")
  return chunk_rows


def sort_rows() -> int:
  """Rows one refinement pass may sort (:data:`SORT_ROWS_ENV` overrides the default)."""
  value = os.environ.get(SORT_ROWS_ENV, "")
  return max(1, int(value)) if value.strip() else DEFAULT_SORT_ROWS


def notes(result: Scan, passes: int, chunk_rows: int) -> list[str]:
  """How the streamed report was computed and what it leaves out."""
  notes = [f"Streamed (--stream): {result.n:,} rows read in chunks of at most {chunk_rows:,}; "
           "the sweep, accuracy and ECE are exact sums over the chunks, and AURC, AUGRC and "
           f"E-AURC were computed exactly in {passes} pass{'es' if passes > 1 else ''} over "
           "the data."]
  if result.labels is not None:
    notes.append("The per-class breakdown is left out under --stream (it needs the in-memory "
                 "path: drop --stream).")
  return notes


def figure_drawer(result: Scan, report: _metrics.ModelReport, settings: Settings,
          name: str) -> Callable[[Path], list[tuple[str, str]]]:
  def draw(folder: Path) -> list[tuple[str, str]]:
    return _figures.draw_model_figures(
        folder, report.metrics, settings, bins=result.calibration.bins(),
        curve=binned_curve(result.histogram, result.n), name=name,
        deployment=report.threshold_choice, curve_caption=curve_caption(result.histogram))
  return draw
