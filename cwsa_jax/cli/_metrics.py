"""Every metric a report states, as typed results: computed once, then formatted, saved, drawn.

:func:`compute_metrics` evaluates the kit's metrics on (confidences, correct)
arrays of shape [..., n] (leading axes: seeds or models) with the conventions
of a :class:`~cwsa_jax.cli._settings.Settings`; :func:`summarize` turns a batch
over seeds into mean and std. ``evaluate`` adds what it reports about one
model (:class:`ModelReport`): the deployment threshold, per-class and
per-group breakdowns, the most damaging samples. Every value is NumPy.

Confidences given as a float64 NumPy array (``evaluate``'s files whose numbers
are not all float32 values, ``_io.compared_confidences``) reach the library as
they are, which compares them with the thresholds and bin edges and orders them
in float64 (float32 stand-ins, at most a few ulp away). Their thresholds are
the grid's decimals (:func:`decimal_thresholds`: a CSV's ``0.55`` is retained
at the grid's 0.55, whose float32 value 0.55000001 lies above it). Any other
confidences are float32, compared with the float32 grid, as they always were.
The reported values, thresholds included, stay float32.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import cwsa_jax as cw
from cwsa_jax import _select, _smooth_ece
from cwsa_jax._aumcc import area
from cwsa_jax.cli._settings import SELECTION_METRIC, Settings


# The threshold sweep of a report, as NumPy: ``thresholds`` [T]; the other fields [..., T].
SweepFields = cw.SweepResult


class Aumcc(NamedTuple):
  """AUMCC of each swept metric ([...]), as :func:`cwsa_jax.aumcc` computes it."""
  cwsa: Any
  cwsa_plus: Any
  selective_accuracy: Any


class Metrics(NamedTuple):
  """The metrics of every report, each [...] (``n`` and the thresholds are shared).

  In the summaries over seeds (:func:`summarize`) every value is a :class:`MeanStd`.
  """
  n: int
  accuracy: Any
  ece: Any
  aurc: Any
  eaurc: Any
  augrc: Any
  aumcc: Aumcc
  sweep: SweepFields


SCALARS = ("accuracy", "ece", "aurc", "eaurc", "augrc")
SWEPT = SweepFields._fields[1:]  # coverage, selective_accuracy, cwsa, cwsa_plus


class MeanStd(NamedTuple):
  """Mean and sample standard deviation over seeds, NaN ignored."""
  mean: np.ndarray
  std: np.ndarray


class ScoringRules(NamedTuple):
  """Brier score and NLL (when the predictions hold full probability vectors or logits)."""
  brier: np.ndarray
  nll: np.ndarray


# What a threshold chosen on the reported data itself is: its operating point is optimistic.
IN_SAMPLE = "evaluated data (in-sample, optimistic)"


class OperatingPoint(NamedTuple):
  """The evaluated data at a threshold chosen on other data (Python floats).

  ``cwsa`` is divided by |S| (as the selection's value); ``selective_accuracy`` and
  ``selective_risk`` are NaN when the threshold retains nothing.
  """
  threshold: float
  coverage: float
  selective_accuracy: float
  selective_risk: float
  cwsa: float


class Deployment(NamedTuple):
  """The deployment threshold a report states: the largest ``metric`` on the grid among the
  thresholds with coverage >= ``min_coverage`` (:func:`cwsa_jax.select_threshold`).

  Attributes:
    metric: the metric maximised.
    min_coverage: the coverage bound (``--min-coverage``).
    choice: the selected threshold and its operating point on the data it was chosen on;
      None when no threshold of the grid keeps that coverage.
    reason: why there is no choice (the library's message), else None.
    selected_on: the held-out predictions file the threshold was chosen on (``--select-on``);
      None when it was chosen on the reported data itself (in-sample, :data:`IN_SAMPLE`).
    evaluated: for a held-out choice, the reported data's operating point at that threshold.
  """
  metric: str
  min_coverage: float
  choice: cw.ThresholdChoice | None
  reason: str | None = None
  selected_on: str | None = None
  evaluated: OperatingPoint | None = None

  @property
  def feasible(self) -> bool:
    return self.choice is not None

  @property
  def held_out(self) -> bool:
    """Whether the threshold was chosen on other data than the reported one."""
    return self.selected_on is not None


class GroupGap(NamedTuple):
  """Best minus worst group at each threshold ([T]). Groups with no samples are left out of
  every gap, and groups that retain nothing at a threshold are left out of the selective
  accuracy, CWSA and CWSA+ gaps there (their coverage, 0, counts in the coverage gap)."""
  coverage: np.ndarray
  selective_accuracy: np.ndarray
  cwsa: np.ndarray
  cwsa_plus: np.ndarray


class GroupBreakdown(NamedTuple):
  """The sweep per group (true class, or a ``--group-by`` column).

  Attributes:
    column: the ``--group-by`` column, None for the classes.
    names: the group labels, in id order.
    counts: [G] samples per group.
    sweep: fields [G, T].
    gap: :class:`GroupGap`.
  """
  column: str | None
  names: tuple[str, ...]
  counts: np.ndarray
  sweep: SweepFields
  gap: GroupGap


class WorstSample(NamedTuple):
  """One retained wrong prediction: its 0-based index, confidence and (negative) CWSA term."""
  index: int
  confidence: float
  term: float


class WorstSamples(NamedTuple):
  """The (at most) ``k`` most damaging samples at threshold ``tau``, worst first."""
  tau: float
  k: int
  samples: tuple[WorstSample, ...]


class PeerMetrics(NamedTuple):
  """The failure-detection and calibration metrics other kits report (float32 scalars [...]).

  ``auroc``, ``fpr_at_95tpr`` (:func:`cwsa_jax.fpr_at_tpr` at 0.95) and the average
  precision with the correct predictions (``average_precision_success``) or the wrong ones
  (``average_precision_error``, ranked by the negated score) as positives depend only on the
  order of the scores; ``smooth_ece`` (automatic bandwidth) needs confidences in [0, 1] (None
  for real-valued scores); ``classwise_ece`` (the report's bins, norm and binning) needs
  per-class probabilities (None without them: the key is then left out of metrics.json).
  """
  auroc: Any
  fpr_at_95tpr: Any
  average_precision_success: Any
  average_precision_error: Any
  smooth_ece: Any = None
  classwise_ece: Any = None


PEERS = PeerMetrics._fields
PEER_LABELS = {"auroc": "AUROC", "fpr_at_95tpr": "FPR@95%TPR",
               "average_precision_success": "AP (success)", "average_precision_error": "AP (error)",
               "smooth_ece": "smooth ECE", "classwise_ece": "classwise ECE"}
# The fields that depend only on the order of the scores (all that real-valued scores get).
ORDER_PEERS = PEERS[:4]
FPR_TARGET = 0.95  # fpr_at_95tpr


def _float32_of_int(x: int) -> np.float32:
  """float32 of the integer ``x >= 0``, rounded once to nearest even (as ``_exact.exact_float``;
  a float64 step would round twice above 2^53)."""
  x = int(x)
  shift = max(x.bit_length() - 24, 0)
  q, r = divmod(x, 1 << shift)
  half = (1 << shift) >> 1
  if shift and (r > half or (r == half and q & 1)):
    q += 1
  return np.float32(np.ldexp(float(q), shift))


_SLACKED_TARGET = np.float32(FPR_TARGET) - np.float32(2.0**-22)  # _ranking's float32 rate test
_AP_UNIT = 48  # _ranking sums each float32 term truncated to 4 base-4096 digits (2^-48)


def fewest_correct(num_correct: int) -> int:
  """The least ``A`` in [0, P] with ``f32(A) / f32(max(P, 1)) >= f32(0.95) - 2^-22`` (``P + 1``
  where none): the rate test of ``cwsa_jax.fpr_at_tpr``, monotone in ``A``."""
  total = np.float32(max(num_correct, 1))
  low, high = 0, num_correct + 1
  while low < high:
    mid = (low + high) // 2
    if np.float32(mid) / total >= _SLACKED_TARGET:
      high = mid
    else:
      low = mid + 1
  return high


def _truncated_units(terms: np.ndarray) -> int:
  """The sum of float32 ``terms`` in [0, 1], each truncated to a multiple of 2^-48, in units of
  2^-48 (exact: float64 holds each term times 2^48, int64 their sum)."""
  return int(np.sum(np.floor(np.ldexp(terms.astype(np.float64), _AP_UNIT)).astype(np.int64)))


class RankSums:
  r"""Exact integer sums over tie groups that give AUROC, FPR@95%TPR and both average
  precisions bit for bit as :mod:`cwsa_jax._ranking` computes them (NumPy, on the host).

  A tie group has ``count`` rows, ``errors`` of them wrong, and ``rows_before`` rows with
  ``errors_before`` errors scoring above it; the groups may come in any order and any number
  of :meth:`add` calls, so a streamed pass and one in-memory sort give the same values.
  With ``P`` correct and ``N`` wrong of ``n`` rows, group ``g`` holding ``p_g`` correct and
  ``e_g`` wrong, ``E_g`` wrong and ``R_g`` rows at or above it (``E_g - e_g``, ``R_g -
  p_g - e_g`` above it), ``C_g = R_g - E_g``:

  .. math::
    2 P N \,\mathrm{AUROC} = \sum_g p_g (2 (N - E_g) + e_g),\qquad
    \mathrm{FPR} = \min_{g:\,C_g \ge A} E_g / N,\\
    \mathrm{AP}_{success} = \sum_g \frac{p_g}{P} \frac{C_g}{R_g},\qquad
    \mathrm{AP}_{error} = \sum_g \frac{e_g}{N} \frac{N - E_g + e_g}{n - R_g + p_g + e_g}

  (``A``: :func:`fewest_correct`); the AP terms are float32 products truncated to
  multiples of 2^-48 and summed exactly, as the library does; each result is rounded once.
  """

  def __init__(self, n: int, num_errors: int):
    self.n, self.num_errors = int(n), int(num_errors)
    self.num_correct = self.n - self.num_errors
    self.need = fewest_correct(self.num_correct)
    self.twice_pairs = self.ap_success = self.ap_error = 0
    self.fewest_wrong = self.num_errors

  def add(self, count: Any, errors: Any, rows_before: Any, errors_before: Any) -> None:
    count, errors, rows_before, errors_before = (np.asarray(x, np.int64) for x in (
        count, errors, rows_before, errors_before))
    if count.size == 0:
      return
    n, big_p, big_n = self.n, self.num_correct, self.num_errors
    right = count - errors
    wrong_through = errors_before + errors  # E_g
    rows_through = rows_before + count  # R_g
    right_through = rows_through - wrong_through  # C_g
    # Each product is below 2 n^2 and the sums below n^2 / 2: int64 for n < 2^31.
    self.twice_pairs += int(np.sum(right * (2 * (big_n - wrong_through) + errors)))
    reaches = right_through >= self.need
    if reaches.any():
      self.fewest_wrong = min(self.fewest_wrong, int(wrong_through[reaches].min()))
    f32 = lambda x: x.astype(np.float32)  # noqa: E731
    # XLA rewrites the library's division of the gains by the scalar P (N) as a product with
    # its reciprocal: the same float32 steps here.
    success = (f32(right) * (np.float32(1) / np.float32(max(big_p, 1)))) * (
        f32(right_through) / f32(np.maximum(rows_through, 1)))
    error = (f32(errors) * (np.float32(1) / np.float32(max(big_n, 1)))) * (
        f32(big_n - errors_before) / f32(np.maximum(n - rows_before, 1)))
    self.ap_success += _truncated_units(success)
    self.ap_error += _truncated_units(error)

  def result(self) -> PeerMetrics:
    """The four order metrics (float32 scalars; NaN where ``cwsa_jax._ranking`` gives NaN)."""
    big_p, big_n = self.num_correct, self.num_errors
    nan = np.float32(np.nan)
    pairs = np.float32(2.0) * np.float32(big_p) * np.float32(big_n)
    auroc = _float32_of_int(self.twice_pairs) / max(pairs, np.float32(1.0))
    fpr = np.float32(self.fewest_wrong) / np.float32(max(big_n, 1))
    ap = lambda units: np.float32(np.ldexp(_float32_of_int(units), -_AP_UNIT))  # noqa: E731
    return PeerMetrics(
        auroc=auroc if pairs > 0 else nan, fpr_at_95tpr=fpr if big_p and big_n else nan,
        average_precision_success=ap(self.ap_success) if big_p else nan,
        average_precision_error=ap(self.ap_error) if big_n else nan)


def rank_metrics(scores: Any, correct: Any) -> PeerMetrics:
  """AUROC, FPR@95%TPR and both average precisions of [n] ``scores`` (any real dtype, ordered
  by its own values; ties are tie groups) and ``correct``, bit for bit the library's values
  (:class:`RankSums` of one sort on the host, no compiled program)."""
  ok = np.asarray(correct, bool).reshape(-1)
  distinct, group = np.unique(np.asarray(scores).reshape(-1), return_inverse=True)
  group = group.reshape(-1)
  # Groups in decreasing score order: counts, errors and the prefix sums above each.
  count = np.bincount(group, minlength=distinct.size)[::-1].astype(np.int64)
  errors = np.bincount(group[~ok], minlength=distinct.size)[::-1].astype(np.int64)
  sums = RankSums(ok.size, int(errors.sum()))
  sums.add(count, errors, np.cumsum(count) - count, np.cumsum(errors) - errors)
  return sums.result()


def mesh_sums(confidences: Any, correct: Any) -> np.ndarray:
  """float32 [2, L + 1] residuals ``c - kappa`` and counts spread onto the smooth ECE's mesh by
  linear interpolation, bit for bit ``_smooth_ece._mesh_sums`` (NumPy on the host).

  Row ``r`` with ``x = 8000 c`` and ``f = x - floor(x)`` adds ``w_r (1 - f)`` at node
  ``floor(x)`` and ``w_r f`` at the next; ``np.add.at`` adds in row order, first every
  ``1 - f`` share and then every ``f`` share, as XLA's scatter-adds do, so the float32
  sums round alike.
  """
  size = _smooth_ece._MESH_INTERVALS
  c = np.asarray(confidences, np.float32).reshape(-1)
  x = c * np.float32(size)
  cell = np.clip(np.floor(x), 0, size - 1)
  frac = x - cell
  cell = cell.astype(np.int64)
  weights = (c - np.asarray(correct, np.float32).reshape(-1), np.ones_like(c))
  out = np.zeros((2, size + 1), np.float32)
  for row, w in enumerate(weights):
    np.add.at(out[row], cell, w * (np.float32(1) - frac))
    np.add.at(out[row], cell + 1, w * frac)
  return out


def _smooth_ece_from_sums(sums):
  """smooth_ece (automatic bandwidth) of one row's mesh sums [2, L + 1]: the library's own
  spectrum, bandwidth and error (``_smooth_ece._row`` after its ``_mesh_sums``)."""
  spectrum, near = _smooth_ece._spectrum(sums), _smooth_ece._boundary_nodes(sums)
  return _smooth_ece._smoothed_error(_smooth_ece._bandwidth(spectrum, near), spectrum, near)


# Mesh sums per call of the smooth ECE program: one shape for every n, every resample block and
# the point estimate (cw.smooth_ece compiles per n).
SMOOTH_BATCH = 8


@jax.jit
def _smooth_ece_batch(sums: jax.Array) -> jax.Array:
  # lax.map, not vmap: each row's steps as the library's (a batched FFT and batched sums
  # round differently, by about 1e-8).
  return jax.lax.map(_smooth_ece_from_sums, sums)


def smooth_ece_of_sums(sums: Any) -> np.ndarray:
  """float32 [...] smooth ECE (automatic bandwidth) of float32 mesh sums [..., 2, L + 1], each
  bit for bit ``cw.smooth_ece`` of the rows they were summed from (:func:`mesh_sums`)."""
  sums = np.asarray(sums, np.float32)
  flat = sums.reshape((-1,) + sums.shape[-2:])
  count = flat.shape[0]
  flat = np.concatenate([flat, np.zeros((-count % SMOOTH_BATCH,) + flat.shape[1:], np.float32)])
  out = [np.asarray(_smooth_ece_batch(flat[i:i + SMOOTH_BATCH]))
         for i in range(0, flat.shape[0], SMOOTH_BATCH)]
  return np.concatenate(out)[:count].reshape(sums.shape[:-2])


def peer_metrics(scores: Any, correct: Any, settings: Settings, *, probs: Any = None,
                 labels: Any = None, real: bool = False, wide: bool = False) -> PeerMetrics:
  """:class:`PeerMetrics` of [n] ``scores`` (confidences, or real-valued scores with ``real``)
  and ``correct``; ``probs`` [n, K] and ``labels`` [n] give the classwise ECE (``wide``: a
  float64 ``probs`` is binned in float64, else as float32). The order metrics follow the
  scores' own dtype (float64 scores are ordered in float64)."""
  ok = np.asarray(correct, bool)
  s = np.asarray(scores)  # float64 real scores keep their own order (np.unique ranks them)
  as_np = lambda x: np.asarray(x, np.float32)  # noqa: E731
  # The order metrics from exact sums on the host: the library's values, bit for bit, without
  # compiling its four programs for each new n.
  out = rank_metrics(s, ok)
  if real:
    return out
  # cw.smooth_ece's value, bit for bit (its mesh sums on the host, then its own steps).
  out = out._replace(smooth_ece=as_np(smooth_ece_of_sums(mesh_sums(s, ok))))
  if probs is not None and labels is not None:
    probs = _kept_confidences(probs) if wide else np.asarray(probs, np.float32)
    out = out._replace(classwise_ece=as_np(cw.classwise_ece(
        probs, np.asarray(labels, np.int32), num_bins=settings.num_bins,
        norm=settings.ece_norm, binning=settings.binning)))
  return out


def _is_wide(confidences: Any) -> bool:
  return isinstance(confidences, np.ndarray) and confidences.dtype == np.float64


def decimal_thresholds(thresholds: Any) -> np.ndarray:
  """float64 [T]: each float32 threshold of a report's grid as its shortest decimal (0.55 for
  ``float32(0.55) = 0.55000001``), the value written on the command line or in the default
  grid: what float64 confidences are compared with (a CSV's ``0.55`` is retained at 0.55)."""
  grid = np.asarray(thresholds, np.float32).reshape(-1)
  return np.array([float(np.format_float_positional(t, unique=True)) for t in grid])


def _grid_for(confidences: Any, settings: Settings) -> np.ndarray:
  """The grid float64 confidences are compared with (:func:`decimal_thresholds`), else the
  float32 grid."""
  return decimal_thresholds(settings.grid) if _is_wide(confidences) else settings.grid


def _kept_confidences(confidences: Any) -> Any:
  """A float64 NumPy array of confidences as it is (compared and ordered in float64 by the
  library), anything else as float32 NumPy."""
  if isinstance(confidences, np.ndarray) and confidences.dtype == np.float64:
    return confidences
  return np.asarray(confidences, np.float32)


class ModelReport(NamedTuple):
  """What ``evaluate`` reports about one model."""
  metrics: Metrics
  threshold_choice: Deployment
  scoring: ScoringRules | None = None
  classes: GroupBreakdown | None = None
  groups: GroupBreakdown | None = None
  worst: WorstSamples | None = None
  peers: PeerMetrics | None = None


def compute_metrics(confidences: Any, correct: Any, settings: Settings) -> Metrics:
  """Every metric of :class:`Metrics` on [..., n] inputs, with the conventions of ``settings``
  (float64 NumPy confidences compared with the grid and bin edges, and ordered, in float64)."""
  c = confidences
  if not (isinstance(c, np.ndarray) and c.dtype == np.float64):
    c = jnp.asarray(confidences, jnp.float32)
  ok = jnp.asarray(correct, jnp.bool_)
  return assemble_metrics(
      n=int(c.shape[-1]),
      accuracy=np.asarray(ok).mean(axis=-1, dtype=np.float64).astype(np.float32),
      ece=cw.ece(c, ok, num_bins=settings.num_bins, norm=settings.ece_norm,
                 binning=settings.binning),
      risk_coverage=cw.risk_coverage_summary(c, ok, convention=settings.aurc_convention),
      result=cw.sweep(c, ok, _grid_for(c, settings), normalize=settings.normalize),
      settings=settings)


def assemble_metrics(*, n: int, accuracy: Any, ece: Any, risk_coverage: cw.RiskCoverageSummary,
                     result: cw.SweepResult, settings: Settings) -> Metrics:
  """:class:`Metrics` from computed parts: the sweep ``result`` [..., T] on ``settings.grid``
  (its CWSA normalised as ``settings.normalize``) also gives the AUMCC of each swept metric,
  the trapezoid of :func:`cwsa_jax.aumcc` over the same sweep (NaN for a grid of one point)."""
  thresholds = settings.grid
  coverage = jnp.asarray(result.coverage)
  if thresholds.size >= 2:
    aumcc = Aumcc(*(np.asarray(area(jnp.asarray(thresholds), coverage,
                                    jnp.asarray(getattr(result, m)), axis=settings.aumcc_axis))
                    for m in Aumcc._fields))
  else:
    aumcc = Aumcc(*[np.full(coverage.shape[:-1], np.nan, np.float32)] * len(Aumcc._fields))
  return Metrics(
      n=n, accuracy=np.asarray(accuracy), ece=np.asarray(ece),
      aurc=np.asarray(risk_coverage.aurc), eaurc=np.asarray(risk_coverage.eaurc),
      augrc=np.asarray(risk_coverage.augrc), aumcc=aumcc,
      sweep=SweepFields(thresholds, *(np.asarray(getattr(result, f)) for f in SWEPT)))


def map_values(fn: Callable[[Any], Any], metrics: Metrics) -> Metrics:
  """``fn`` applied to every value of ``metrics`` (not to ``n`` nor to the thresholds)."""
  return metrics._replace(
      **{name: fn(getattr(metrics, name)) for name in SCALARS},
      aumcc=Aumcc(*map(fn, metrics.aumcc)),
      sweep=metrics.sweep._replace(**{f: fn(getattr(metrics.sweep, f)) for f in SWEPT}))


def mean_std(values: Any) -> MeanStd:
  """Mean and sample std over axis 0, ignoring NaN (std 0 for one value, NaN for none)."""
  values = np.asarray(values, np.float64)
  finite = np.isfinite(values)
  count = finite.sum(axis=0)
  total = np.where(finite, values, 0.0).sum(axis=0)
  mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
  sq = np.where(finite, (values - mean) ** 2, 0.0).sum(axis=0)
  std = np.where(count > 1, np.sqrt(sq / np.maximum(count - 1, 1)), np.where(count == 1, 0.0, np.nan))
  return MeanStd(mean, std)


def summarize(metrics: Metrics) -> Metrics:
  """Every value of [S, ...] ``metrics`` as its :class:`MeanStd` over the seed axis."""
  return map_values(mean_std, metrics)


def threshold_index(thresholds: Any, tau: float) -> int:
  """Index of the threshold of the grid nearest to ``tau``."""
  return int(np.argmin(np.abs(np.asarray(thresholds, np.float64) - tau)))


def coverage_span(coverage: Any) -> tuple[np.ndarray, np.ndarray]:
  """Highest and lowest non-zero coverage of a sweep ([..., T]): the range AUMCC integrates over.

  NaN where no threshold retains anything.
  """
  cov = np.asarray(coverage, np.float64)
  nonzero = cov > 0
  high = np.where(nonzero.any(axis=-1), np.where(nonzero, cov, -np.inf).max(axis=-1), np.nan)
  low = np.where(nonzero.any(axis=-1), np.where(nonzero, cov, np.inf).min(axis=-1), np.nan)
  return high, low


def choose_threshold(confidences: Any, correct: Any, settings: Settings) -> Deployment:
  """:func:`cwsa_jax.select_threshold` on the report's grid under ``settings.min_coverage``
  (float64 confidences against :func:`decimal_thresholds`; the choice states the grid's
  float32 value, as every report does)."""
  c = _kept_confidences(confidences)
  deployment = _deployment(lambda: cw.select_threshold(
      c, np.asarray(correct, bool), thresholds=_grid_for(c, settings),
      metric=SELECTION_METRIC, min_coverage=settings.min_coverage), settings)
  if deployment.choice is None or not _is_wide(c):
    return deployment
  return deployment._replace(choice=deployment.choice._replace(
      threshold=float(np.float32(deployment.choice.threshold))))


def choose_on_sweep(result: cw.SweepResult, settings: Settings) -> Deployment:
  """:func:`choose_threshold` from the data's sweep on ``settings.grid`` (CWSA divided by |S|,
  ``normalize="retained"``), e.g. a streamed ``SweepState``'s: the same choice."""
  return _deployment(lambda: _select.select_from_sweep(
      result, metric=SELECTION_METRIC, min_coverage=settings.min_coverage, max_risk=None),
      settings)


def _deployment(select: Callable[[], cw.ThresholdChoice], settings: Settings) -> Deployment:
  try:
    choice = select()
  except ValueError as e:
    return Deployment(SELECTION_METRIC, settings.min_coverage, None, str(e))
  return Deployment(SELECTION_METRIC, settings.min_coverage, choice)


def operating_point(confidences: Any, correct: Any, tau: float) -> OperatingPoint:
  """Coverage, selective accuracy and risk, and CWSA (divided by |S|) of the data at ``tau``."""
  c = _kept_confidences(confidences)
  result = cw.sweep(c, np.asarray(correct, bool),
                    decimal_thresholds([tau]) if _is_wide(c) else np.asarray([tau], np.float32))
  return point_of_sweep(result, 0)


def point_of_sweep(result: cw.SweepResult, index: int) -> OperatingPoint:
  """The :class:`OperatingPoint` at threshold ``index`` of a sweep (``normalize="retained"``)."""
  accuracy = float(np.asarray(result.selective_accuracy)[index])
  return OperatingPoint(threshold=float(np.asarray(result.thresholds)[index]),
                        coverage=float(np.asarray(result.coverage)[index]),
                        selective_accuracy=accuracy, selective_risk=1.0 - accuracy,
                        cwsa=float(np.asarray(result.cwsa)[index]))


def choose_held_out(selection: tuple[Any, Any], confidences: Any, correct: Any,
                    settings: Settings, *, file: str,
                    evaluated_at: Callable[[float], OperatingPoint] | None = None) -> Deployment:
  """:func:`choose_threshold` on held-out ``selection`` = (confidences, correct) from ``file``,
  with the evaluated (``confidences``, ``correct``) operating point at the chosen threshold
  (or ``evaluated_at(threshold)``'s, when the evaluated data is not in memory)."""
  deployment = choose_threshold(*selection, settings)._replace(selected_on=str(file))
  if deployment.choice is None:
    return deployment
  tau = deployment.choice.threshold
  return deployment._replace(evaluated=operating_point(confidences, correct, tau)
                             if evaluated_at is None else evaluated_at(tau))


def group_metrics(confidences: Any, correct: Any, groups: Any, names: tuple[str, ...],
                  settings: Settings, *, column: str | None = None) -> GroupBreakdown:
  """Per-group sweep (:func:`cwsa_jax.sweep_by_group`) and best-worst gap on the grid.

  Args:
    confidences, correct: [n] arrays.
    groups: [n] int ids in [0, len(names)).
    names: the group labels, in id order.
    settings: the grid and the CWSA normalisation.
    column: the ``--group-by`` column the groups come from (None for the classes).
  """
  ids = np.asarray(groups, np.int64)
  thresholds = settings.grid
  c = confidences
  if not (isinstance(c, np.ndarray) and c.dtype == np.float64):
    c = jnp.asarray(confidences, jnp.float32)
  result = cw.sweep_by_group(c, jnp.asarray(correct, jnp.bool_), ids, _grid_for(c, settings),
                             num_groups=len(names), normalize=settings.normalize)
  return GroupBreakdown(
      column=column,
      names=tuple(str(x) for x in names),
      counts=np.bincount(ids, minlength=len(names)),
      sweep=SweepFields(thresholds, *(np.asarray(getattr(result, f)) for f in SWEPT)),
      gap=GroupGap(*(np.asarray(cw.group_gap(retained_only(result), f))
                     for f in GroupGap._fields)))


def retained_only(result: cw.SweepResult) -> cw.SweepResult:
  """A per-group sweep with CWSA and CWSA+ NaN where a group retains nothing, as selective
  accuracy is: the paper's convention 0 there is not a measured value, so the gaps leave
  those groups out of every column alike."""
  empty = np.asarray(result.coverage) == 0
  return result._replace(**{f: np.where(empty, np.nan, np.asarray(getattr(result, f)))
                            for f in ("cwsa", "cwsa_plus")})


def worst_samples(confidences: Any, correct: Any, k: int, tau: float) -> WorstSamples:
  """The ``k`` most damaging samples (most negative CWSA terms) at threshold ``tau`` (float64
  confidences retained as float64 compares them with :func:`decimal_thresholds`; each stated
  as its float32 value)."""
  c = _kept_confidences(confidences)
  result = cw.contributions(c, np.asarray(correct, bool),
                            decimal_thresholds([tau])[0] if _is_wide(c) else np.float32(tau))
  index = np.asarray(cw.most_damaging(result, k=k))
  terms = np.asarray(result.terms)
  return WorstSamples(float(np.float32(tau)), k, tuple(
      WorstSample(int(i), float(np.float32(c[i])), float(terms[i])) for i in index))
