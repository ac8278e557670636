"""Every metric a report states, as typed results: computed once, then formatted, saved, drawn.

:func:`compute_metrics` evaluates the kit's metrics on (confidences, correct)
arrays of shape [..., n] (leading axes: seeds or models) with the conventions
of a :class:`~cwsa_jax.cli._settings.Settings`; :func:`summarize` turns a batch
over seeds into mean and std. ``evaluate`` adds what it reports about one
model (:class:`ModelReport`): the deployment threshold, per-class and
per-group breakdowns, the most damaging samples. Every value is NumPy.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax.numpy as jnp
import numpy as np

import cwsa_jax as cw
from cwsa_jax import _select
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


class ModelReport(NamedTuple):
  """What ``evaluate`` reports about one model."""
  metrics: Metrics
  threshold_choice: Deployment
  scoring: ScoringRules | None = None
  classes: GroupBreakdown | None = None
  groups: GroupBreakdown | None = None
  worst: WorstSamples | None = None


def compute_metrics(confidences: Any, correct: Any, settings: Settings) -> Metrics:
  """Every metric of :class:`Metrics` on [..., n] inputs, with the conventions of ``settings``."""
  c = jnp.asarray(confidences, jnp.float32)
  ok = jnp.asarray(correct, jnp.bool_)
  return assemble_metrics(
      n=int(c.shape[-1]),
      accuracy=np.asarray(ok).mean(axis=-1, dtype=np.float64).astype(np.float32),
      ece=cw.ece(c, ok, num_bins=settings.num_bins, norm=settings.ece_norm,
                 binning=settings.binning),
      risk_coverage=cw.risk_coverage_summary(c, ok, convention=settings.aurc_convention),
      result=cw.sweep(c, ok, settings.grid, normalize=settings.normalize),
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
  """:func:`cwsa_jax.select_threshold` on the report's grid under ``settings.min_coverage``."""
  return _deployment(lambda: cw.select_threshold(
      np.asarray(confidences, np.float32), np.asarray(correct, bool), thresholds=settings.grid,
      metric=SELECTION_METRIC, min_coverage=settings.min_coverage), settings)


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
  result = cw.sweep(np.asarray(confidences, np.float32), np.asarray(correct, bool),
                    np.asarray([tau], np.float32))
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
  result = cw.sweep_by_group(jnp.asarray(confidences, jnp.float32), jnp.asarray(correct, jnp.bool_),
                             ids, thresholds, num_groups=len(names), normalize=settings.normalize)
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
  """The ``k`` most damaging samples (most negative CWSA terms) at threshold ``tau``."""
  c = np.asarray(confidences, np.float32)
  result = cw.contributions(c, np.asarray(correct, bool), np.float32(tau))
  index = np.asarray(cw.most_damaging(result, k=k))
  terms = np.asarray(result.terms)
  return WorstSamples(float(np.float32(tau)), k, tuple(
      WorstSample(int(i), float(c[i]), float(terms[i])) for i in index))
