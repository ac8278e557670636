"""Bootstrap intervals at the command line: the flags, one traceable function of every
reported metric, and the table rows.

``evaluate`` reports percentile-bootstrap intervals of each metric
(:func:`cwsa_jax.bootstrap_ci`), ``compare`` the paired differences between
two models on the same test set (:func:`cwsa_jax.paired_bootstrap`).
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import cwsa_jax as cw
from cwsa_jax import _bootstrap  # the evaluation bootstrap and its progress hook
from cwsa_jax.cli._metrics import SCALARS
from cwsa_jax.cli._settings import Settings
from cwsa_jax.cli._util import UserError

# A percentile interval's ends are order statistics of the resamples: with fewer than
# MIN_TAIL_RESAMPLES beyond each end they are noise; with fewer than MIN_BOOTSTRAP_SAMPLES
# samples the resamples take so few distinct values that the intervals mean nothing.
MIN_TAIL_RESAMPLES = 5
MIN_BOOTSTRAP_SAMPLES = 10


def add_bootstrap_flags(p: argparse.ArgumentParser, *, default_resamples: int,
                        allow_zero: bool = True) -> None:
  """--bootstrap N, --level L, --seed S (shared by evaluate and compare)."""
  p.add_argument("--bootstrap", type=int, default=default_resamples, metavar="N",
                 help=f"bootstrap resamples for the intervals (default {default_resamples}; at "
                 f"least {min_resamples(0.95)} for 95%% intervals"
                 + ("; 0 = no intervals)" if allow_zero else ")"))
  p.add_argument("--level", type=float, default=0.95, help="interval level (default 0.95)")
  p.add_argument("--seed", type=int, default=0, help="seed of the resampling (default 0)")


def min_resamples(level: float) -> int:
  """The fewest resamples that leave MIN_TAIL_RESAMPLES beyond each end of a ``level`` interval."""
  return math.ceil(round(2 * MIN_TAIL_RESAMPLES / (1.0 - level), 6))


def check_bootstrap_flags(args: argparse.Namespace, *, allow_zero: bool) -> None:
  """Refuses a --level outside (0, 1) and too few --bootstrap resamples for that level."""
  if not 0.0 < args.level < 1.0:
    raise UserError(f"--level must lie in (0, 1), got {args.level}")
  if args.bootstrap < (0 if allow_zero else 1):
    raise UserError(f"--bootstrap must be >= {0 if allow_zero else 1}, got {args.bootstrap}")
  fewest = min_resamples(args.level)
  if 0 < args.bootstrap < fewest:
    raise UserError(f"--bootstrap {args.bootstrap} is too few resamples for {args.level * 100:g}% "
                    f"intervals: fewer than {MIN_TAIL_RESAMPLES} would fall beyond each end; "
                    f"use at least {fewest}" + (" (or 0 for no intervals)" if allow_zero else ""))


def bootstrap_resamples(args: argparse.Namespace, num_samples: int, *, refuse: bool) -> int:
  """``args.bootstrap``, or 0 when ``num_samples`` is too few to resample.

  With ``refuse`` too few samples is a :class:`UserError`; else a warning on
  stderr says that no intervals are reported.
  """
  if not args.bootstrap or num_samples >= MIN_BOOTSTRAP_SAMPLES:
    return args.bootstrap
  message = (f"n = {num_samples} sample(s) is too few for bootstrap intervals (need at least "
             f"{MIN_BOOTSTRAP_SAMPLES})")
  if refuse:
    raise UserError(message)
  print(f"cwsa-jax {args.command}: warning: {message}; no intervals reported", file=sys.stderr)
  return 0


# Every metric with an interval: scalars, and the sweep fields [T] on the settings' grid.
IntervalMetrics = _bootstrap.EvaluationMetrics


class Intervals(NamedTuple):
  """Percentile-bootstrap intervals of one model's metrics (``low``, ``high``)."""
  level: float
  num_resamples: int
  seed: int
  low: IntervalMetrics
  high: IntervalMetrics
  resampling: str = "multinomial"  # or "poisson"


class Comparison(NamedTuple):
  """Paired bootstrap of two models: A, B, A - B, its interval and two-sided p-value."""
  level: float
  num_resamples: int
  seed: int
  estimate_a: IntervalMetrics
  estimate_b: IntervalMetrics
  difference: IntervalMetrics
  low: IntervalMetrics
  high: IntervalMetrics
  p_value: IntervalMetrics
  resampling: str = "multinomial"  # or "poisson"


@functools.lru_cache(maxsize=8)  # one function per settings: jit caches stay warm
def metric_fn(settings: Settings) -> Callable[[jax.Array, jax.Array], IntervalMetrics]:
  """``(confidences [n], correct [n]) -> IntervalMetrics`` with the conventions of ``settings``."""
  thresholds = jnp.asarray(settings.grid)

  def fn(c, ok):
    result = cw.sweep(c, ok, thresholds, normalize=settings.normalize)
    summary = cw.risk_coverage_summary(c, ok, convention=settings.aurc_convention)
    return IntervalMetrics(
        # An exact integer count: identical correctness gives an identical accuracy.
        accuracy=jnp.sum(ok, dtype=jnp.int32).astype(jnp.float32) / ok.shape[-1],
        ece=cw.ece(c, ok, num_bins=settings.num_bins, norm=settings.ece_norm,
                   binning=settings.binning),
        aurc=summary.aurc, eaurc=summary.eaurc, augrc=summary.augrc,
        coverage=result.coverage, selective_accuracy=result.selective_accuracy,
        cwsa=result.cwsa, cwsa_plus=result.cwsa_plus)

  return fn


def _as_numpy(values: IntervalMetrics) -> IntervalMetrics:
  return IntervalMetrics(*map(np.asarray, values))


RESAMPLING_HELP = ("bootstrap resamples: poisson (each row weighted by a Poisson(1) draw; "
                   "the default where it applies: --binning width and --aurc step or trapezoid) "
                   "or multinomial (n rows drawn with replacement; the default otherwise)")


def add_resampling_flag(p: argparse.ArgumentParser, help: str = RESAMPLING_HELP) -> None:
  """--resampling poisson|multinomial (evaluate, compare), described by ``help``."""
  p.add_argument("--resampling", choices=_bootstrap.RESAMPLING, help=help)


def resampling_scheme(settings: Settings, requested: str | None) -> str:
  """The resampling of :func:`evaluation_intervals`: ``requested``, or Poisson where the
  one-sort evaluation bootstrap applies and multinomial elsewhere.

  Raises:
    UserError: Poisson was requested for settings only the multinomial bootstrap handles.
  """
  if requested == "poisson" and not _one_sort(settings):
    raise UserError("--resampling poisson needs --binning width and --aurc step or trapezoid "
                    f"(got --binning {settings.binning}, --aurc {settings.aurc_convention})")
  return requested or ("poisson" if _one_sort(settings) else "multinomial")


def _one_sort(settings: Settings) -> bool:
  """Whether :func:`cwsa_jax._bootstrap.bootstrap_evaluation` handles these conventions."""
  return settings.binning == "width" and settings.aurc_convention in ("step", "trapezoid")


def evaluation_intervals(confidences: Any, correct: Any, settings: Settings, *,
                         num_resamples: int, level: float, seed: int,
                         resampling: str | None = None,
                         progress: Callable[[int], Any] | None = None) -> Intervals:
  """Percentile-bootstrap intervals of every metric of one model; ``resampling`` as
  :func:`resampling_scheme` resolves it; ``progress(k)`` is called each time k more
  resamples are done."""
  r, scheme = _bootstrap_models([(confidences, correct)], settings, num_resamples=num_resamples,
                                level=level, seed=seed, resampling=resampling, progress=progress)
  return Intervals(level, num_resamples, seed, _as_numpy(r.low), _as_numpy(r.high), scheme)


def comparison(a: tuple[Any, Any], b: tuple[Any, Any], settings: Settings, *,
               num_resamples: int, level: float, seed: int, resampling: str | None = None,
               progress: Callable[[int], Any] | None = None) -> Comparison:
  """Paired bootstrap of every metric of models ``a`` and ``b`` ((confidences, correct) each);
  ``resampling`` and ``progress`` as in :func:`evaluation_intervals`."""
  r, scheme = _bootstrap_models([a, b], settings, num_resamples=num_resamples, level=level,
                                seed=seed, resampling=resampling, progress=progress)
  return Comparison(level, num_resamples, seed, *map(_as_numpy, r), resampling=scheme)


def _bootstrap_models(models: list, settings: Settings, *, num_resamples: int, level: float,
                      seed: int, resampling: str | None,
                      progress: Callable[[int], Any] | None) -> tuple[Any, str]:
  """The bootstrap of one model's metrics, or of two models' paired differences, and its
  resampling scheme: every metric of each resample from one sort and one bucketing of each
  model's data where that applies, else ``bootstrap_ci`` / ``paired_bootstrap`` of
  :func:`metric_fn`."""
  arrays = [jnp.asarray(x, dt) for model in models
            for x, dt in zip(model, (jnp.float32, jnp.bool_))]
  one_sort, generic = ((_bootstrap.bootstrap_evaluation, cw.bootstrap_ci) if len(models) == 1
                       else (_bootstrap.paired_evaluation, cw.paired_bootstrap))
  scheme = resampling_scheme(settings, resampling)
  with _bootstrap.reporting(progress):
    if _one_sort(settings) and arrays[0].shape[0] < _bootstrap.MAX_EVALUATION_N[scheme]:
      r = one_sort(*arrays, settings.grid, key=jax.random.key(seed), num_resamples=num_resamples,
                   level=level, num_bins=settings.num_bins, ece_norm=settings.ece_norm,
                   aurc_convention=settings.aurc_convention, normalize=settings.normalize,
                   resampling=scheme)
    else:  # other conventions, or more samples than the one-sort bootstrap sums exactly
      scheme = "multinomial"
      r = generic(metric_fn(settings), *arrays, key=jax.random.key(seed),
                  num_resamples=num_resamples, level=level)
  return r, scheme


# An estimate outside its own percentile interval: marked in the tables, flagged in JSON.
OUTSIDE_MARK = "‡"
OUTSIDE_EXPLANATION = (
    "the estimate lies outside its own percentile interval. Binned and tie-sensitive statistics "
    "(ECE; AURC, E-AURC and AUGRC, which group tied confidences) are biased under resampling, "
    "since repeated rows change the bins and the tie groups: the percentile interval is for "
    "the resampled statistic's spread, and the estimate may lie outside it. The interval is "
    "reported as the bootstrap gives it.")
OUTSIDE_NOTE = f"{OUTSIDE_MARK} Marked values: {OUTSIDE_EXPLANATION}"
# Float32 rounding between the estimate and the resamples is not "outside".
_OUTSIDE_ATOL, _OUTSIDE_RTOL = 1e-6, 1e-5


def estimates(metrics: Any) -> IntervalMetrics:
  """The estimates of a report's :class:`~cwsa_jax.cli._metrics.Metrics` that have an
  interval (the sweep fields [T] on the settings' grid), as NumPy."""
  return IntervalMetrics(**{name: np.asarray(getattr(metrics, name)) for name in SCALARS},
                         **{f: np.asarray(getattr(metrics.sweep, f))
                            for f in IntervalMetrics._fields if f not in SCALARS})


def outside_interval(estimate: IntervalMetrics, low: IntervalMetrics,
                     high: IntervalMetrics) -> IntervalMetrics:
  """Per metric (and threshold), whether ``estimate`` lies outside [``low``, ``high``] by more
  than float32 rounding; False where any of the three is NaN."""
  def outside(e, lo, hi):
    e, lo, hi = (np.asarray(x, np.float64) for x in (e, lo, hi))
    slack = _OUTSIDE_ATOL + _OUTSIDE_RTOL * np.abs(e)
    with np.errstate(invalid="ignore"):
      return (e < lo - slack) | (e > hi + slack)
  return IntervalMetrics(*map(outside, estimate, low, high))


def outside_json(estimate: IntervalMetrics, low: IntervalMetrics,
                 high: IntervalMetrics) -> dict[str, Any]:
  """``estimate_outside_interval`` beside the ``low`` / ``high`` ends in metrics.json (true or
  false per metric, a list over the thresholds for the sweep fields), and
  ``estimate_outside_note`` when any is true."""
  flags = outside_interval(estimate, low, high)
  out = {"estimate_outside_interval": {name: np.asarray(value).tolist() for name, value
                                       in sorted(flags._asdict().items())}}
  if any(np.any(value) for value in flags):
    out["estimate_outside_note"] = OUTSIDE_EXPLANATION[0].upper() + OUTSIDE_EXPLANATION[1:]
  return out


def outside_notes(rows: list[list[str]]) -> list[str]:
  """[:data:`OUTSIDE_NOTE`] when a table row carries :data:`OUTSIDE_MARK`, else []."""
  return [OUTSIDE_NOTE] if any(OUTSIDE_MARK in cell for row in rows for cell in row) else []


def _marked(text: str, outside: Any) -> str:
  return f"{text} {OUTSIDE_MARK}" if bool(outside) else text


def interval_rows(metrics: Any, intervals: Intervals, settings: Settings) -> list[list[str]]:
  """(metric, value, low, high) rows of the scalar metrics and the sweep at each threshold
  of ``settings`` that :func:`_shown` picks; ``metrics`` is the report's
  :class:`~cwsa_jax.cli._metrics.Metrics`. A value outside its interval carries
  :data:`OUTSIDE_MARK` (see :func:`outside_notes`)."""
  low, high = intervals.low, intervals.high
  value = estimates(metrics)
  outside = outside_interval(value, low, high)
  rows = [[name, _marked(f"{float(getattr(value, name)):.5f}", getattr(outside, name)),
           f"{float(getattr(low, name)):.5f}", f"{float(getattr(high, name)):.5f}"]
          for name in SCALARS]
  for j in _shown(settings.thresholds):
    tau = settings.thresholds[j]
    for f in ("cwsa", "cwsa_plus", "coverage"):
      rows.append([f"{f}@{tau:g}", _marked(f"{float(getattr(value, f)[j]):.5f}",
                                           getattr(outside, f)[j]),
                   f"{float(getattr(low, f)[j]):.5f}", f"{float(getattr(high, f)[j]):.5f}"])
  return rows


# compare prints every requested threshold up to this many, else the first this many.
MAX_COMPARE_THRESHOLDS = 6


def comparison_rows(comp: Comparison, thresholds: tuple[float, ...]) -> list[list[str]]:
  """(metric, A, B, A - B, low, high, p) rows: the scalars, then the sweep at the thresholds
  :func:`compared_thresholds` shows; an A - B outside its interval carries
  :data:`OUTSIDE_MARK`."""
  outside = outside_interval(comp.difference, comp.low, comp.high)

  def row(label, get):
    values = [get(v) for v in (comp.estimate_a, comp.estimate_b, comp.difference, comp.low,
                               comp.high)]
    cells = [f"{v:+.5f}" if i >= 2 else f"{v:.5f}" for i, v in enumerate(values)]
    cells[2] = _marked(cells[2], get(outside))
    return [label] + cells + [f"{get(comp.p_value):.4f}"]
  rows = [row(name, lambda m, name=name: float(getattr(m, name))) for name in SCALARS]
  for j in compared_thresholds(thresholds)[0]:
    for f in ("cwsa", "cwsa_plus", "selective_accuracy", "coverage"):
      rows.append(row(f"{f}@{thresholds[j]:g}", lambda m, f=f, j=j: float(getattr(m, f)[j])))
  return rows


def compared_thresholds(thresholds: tuple[float, ...]) -> tuple[list[int], str | None]:
  """Indices of the thresholds compare's table shows (every one, or the first
  :data:`MAX_COMPARE_THRESHOLDS`) and, when some are left out, which ones."""
  shown = list(range(min(len(thresholds), MAX_COMPARE_THRESHOLDS)))
  rest = [f"{t:g}" for t in thresholds[len(shown):]]
  if not rest:
    return shown, None
  listed = ", ".join(rest) if len(rest) <= 8 else f"{', '.join(rest[:3])}, ..., {rest[-1]}"
  return shown, (f"the table shows the first {len(shown)} of {len(thresholds)} thresholds; not "
                 f"shown: {listed}")


def _shown(thresholds: tuple[float, ...]) -> list[int]:
  """Indices of the thresholds shown in tables: 0.5 and 0.9 when present, else all (<= 5)."""
  picked = [j for j, t in enumerate(thresholds) if abs(t - 0.5) < 1e-6 or abs(t - 0.9) < 1e-6]
  if picked:
    return picked
  return list(range(len(thresholds)))[:5]
