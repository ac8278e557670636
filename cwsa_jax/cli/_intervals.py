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
from jax import lax

import cwsa_jax as cw
from cwsa_jax import _bootstrap  # the evaluation bootstrap and its progress hook
from cwsa_jax import _calibration, _smooth_ece, _stats
from cwsa_jax._bootstrap import _intervals as _percentile
from cwsa_jax._bootstrap import _runner, _sampler
from cwsa_jax._risk_coverage_kernels import _TARGET_SLACK
from cwsa_jax.cli._metrics import FPR_TARGET, SCALARS, PeerMetrics
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
  """Percentile-bootstrap intervals of one model's metrics (``low``, ``high``), and of its
  :class:`~cwsa_jax.cli._metrics.PeerMetrics` from the same resamples (``peers``: a
  :class:`cwsa_jax.BootstrapResult` of them, None fields where a metric does not apply;
  None when they were not resampled)."""
  level: float
  num_resamples: int
  seed: int
  low: IntervalMetrics
  high: IntervalMetrics
  resampling: str = "multinomial"  # or "poisson"
  peers: Any = None
  # Metrics reported without an interval (null low / high): the peer metrics under --stream.
  unresampled: tuple[str, ...] = ()


def unresampled_note(names: tuple[str, ...]) -> str:
  """The one-line note of metrics.json's ``intervals`` when ``names`` have null intervals."""
  return (f"--stream: {', '.join(names)} have no interval (null): the streamed bootstrap "
          "resamples the other metrics only; evaluate without --stream for theirs.")


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
  peers: Any = None  # a cwsa_jax.PairedBootstrapResult of PeerMetrics, or None


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


# --------------------------------------------------------------------------
# The peer metrics' resamples (AUROC, FPR@95TPR, AP, smooth ECE, classwise ECE)
# --------------------------------------------------------------------------
#
# The one-sort evaluation engine (_bootstrap._engine) sums only the sweep, the ECE bins and
# the areas, so the peer metrics are resampled here, with the very resamples it draws: the
# multinomial indices I_b of bootstrap_ci / bootstrap_evaluation, or the Poisson(1)
# multiplicity m_br of input row r (_sampler, the same seeds for the same --seed). Correctness
# first: a multinomial resample gathers the rows and calls the library's own functions on
# them; a Poisson one weights each row by m_br, which is the library function on the rows
# repeated m_br times (the rank metrics from one sort and integer tie-group counts, the smooth
# ECE from weighted mesh sums, the classwise ECE from weighted bin sums; float32 rounding
# aside; tests/test_cli_ranking_metrics.py checks both against the repeated rows). The smooth
# ECE of both schemes comes from weighted mesh sums (a multinomial row's weight: its count in
# I_b), in batches of resamples of one program for every n (_smooth_ece_of_resamples).


class PeerInputs(NamedTuple):
  """One model's rows for the peer metrics' resamples.

  Attributes:
    scores: float32 [n] in [0, 1]: the confidences, or order-preserving stand-ins of
      real-valued scores (``_order.stand_ins``).
    correct: bool [n].
    real: whether ``scores`` are stand-ins (then only the order metrics are resampled).
    probs, labels: float32 [n, K] probabilities and int32 [n] labels (classwise ECE), or None.
  """
  scores: np.ndarray
  correct: np.ndarray
  real: bool = False
  probs: np.ndarray | None = None
  labels: np.ndarray | None = None


class _PeerOptions(NamedTuple):  # static: one compilation per report's conventions
  num_bins: int
  norm: str
  binning: str
  smooth: bool
  classwise: bool
  num_groups: int  # tie groups of the scores (Poisson)


def _library_peers(c, ok, probs, labels, options: _PeerOptions) -> PeerMetrics:
  """The library's functions on one (gathered) resample."""
  out = PeerMetrics(
      auroc=cw.auroc(c, ok), fpr_at_95tpr=cw.fpr_at_tpr(c, ok, FPR_TARGET),
      average_precision_success=cw.average_precision(c, ok, positive="correct"),
      average_precision_error=cw.average_precision(c, ok, positive="error"))
  if options.smooth:
    out = out._replace(smooth_ece=cw.smooth_ece(c, ok))
  if options.classwise:
    out = out._replace(classwise_ece=cw.classwise_ece(
        probs, labels, num_bins=options.num_bins, norm=options.norm, binning=options.binning))
  return out


def _float(x):
  return x.astype(jnp.float32)


def _weighted_ranking(w, ok, group, num_groups: int) -> PeerMetrics:
  """The rank metrics of rows sorted by decreasing score (tie group ``group`` [n], 0 the
  highest) with integer weights ``w`` [n]: the library's formulas on exact int32 counts per
  tie group (cwsa_jax/_ranking.py), rounded to float32 at the end."""
  right = jax.ops.segment_sum(jnp.where(ok, w, 0), group, num_segments=num_groups)
  wrong = jax.ops.segment_sum(jnp.where(ok, 0, w), group, num_segments=num_groups)
  total = right + wrong
  p, n = jnp.sum(right), jnp.sum(wrong)
  acc_right, acc_wrong, acc_total = (jnp.cumsum(x) for x in (right, wrong, total))
  both = (p > 0) & (n > 0)
  fp, fn = _float(jnp.maximum(p, 1)), _float(jnp.maximum(n, 1))
  # Mann-Whitney: each correct row beats the wrong rows below its group, half its own group's.
  pairs = jnp.sum(_float(right) * _float(2 * (n - acc_wrong) + wrong))
  auroc = jnp.where(both, pairs / (2 * fp * fn), jnp.nan)
  reaches = _float(acc_right) / fp >= jnp.float32(FPR_TARGET) - _TARGET_SLACK
  fpr = jnp.where(both, _float(jnp.min(jnp.where(reaches, acc_wrong, n))) / fn, jnp.nan)
  precision = _float(acc_right) / _float(jnp.maximum(acc_total, 1))
  ap_success = jnp.where(p > 0, jnp.sum(_float(right) * precision) / fp, jnp.nan)
  # Ranked by the negated score: a threshold accepts its group and every group below it.
  below_wrong = n - acc_wrong + wrong
  below_total = (p + n) - acc_total + total
  precision_error = _float(below_wrong) / _float(jnp.maximum(below_total, 1))
  ap_error = jnp.where(n > 0, jnp.sum(_float(wrong) * precision_error) / fn, jnp.nan)
  return PeerMetrics(auroc, fpr, ap_success, ap_error)


def _weighted_mesh_sums(w, c, ok):
  """The smooth ECE's mesh sums [2, L + 1] of the rows repeated ``w`` times (their smooth ECE:
  ``_smooth_ece.searched_smooth_ece``)."""
  return _smooth_ece._mesh_sums(c, _float(ok), _float(w))


def _weighted_classwise_ece(w, probs, labels, options: _PeerOptions):
  """classwise_ece (equal-width bins) of the rows repeated ``w`` times: per class, the
  weighted bin sums of ece's bins (_calibration.bin_index) and its error formula."""
  num_classes, num_bins = probs.shape[1], options.num_bins
  index = _calibration.bin_index(probs, _calibration.width_edges(num_bins))  # [n, K]
  segment = (index + num_bins * jnp.arange(num_classes, dtype=jnp.int32)).ravel()
  wf = jnp.broadcast_to(_float(w)[:, None], probs.shape)
  hit = _float(labels[:, None] == jnp.arange(num_classes, dtype=labels.dtype))
  sums = [jax.ops.segment_sum(x.ravel(), segment, num_segments=num_classes * num_bins
                              ).reshape(num_classes, num_bins)
          for x in (wf, wf * hit, wf * probs)]
  count, right, confidence = sums
  totals = _stats.BinTotals(count, right, confidence, confidence - right)
  errors = jax.vmap(lambda t: _calibration.error_from_totals(t, options.norm))(totals)
  return jnp.mean(errors)


@functools.partial(jax.jit, static_argnames=("options", "num_chunks"), **_sampler._RESAMPLING)
def _multinomial_peers_jit(data, key, start, options, num_chunks):
  c, ok, probs, labels = data
  n = ok.shape[0]

  def one(b):
    idx = _sampler._indices_from_seed(_sampler._seed(key, b), n)
    take = lambda x: None if x is None else x[idx]  # noqa: E731
    out = _library_peers(c[idx], ok[idx], take(probs), take(labels),
                         options._replace(smooth=False))
    if options.smooth:  # mesh sums weighted by each row's count: the Poisson path's smooth ECE
      out = out._replace(smooth_ece=_weighted_mesh_sums(jnp.bincount(idx, length=n), c, ok))
    return out

  return lax.map(one, start + jnp.arange(num_chunks, dtype=jnp.uint32))


@functools.partial(jax.jit, static_argnames=("options", "num_chunks"), **_sampler._RESAMPLING)
def _poisson_peers_jit(data, key, start, options, num_chunks):
  c, ok, probs, labels, order, group, num_rows = data
  rows = jnp.arange(ok.shape[0], dtype=jnp.uint32)  # each row's input position, as the engine

  def one(b):
    w = _sampler._poisson_from_seed(_sampler._seed(key, b), rows)
    w = jnp.where(rows < num_rows, w, 0)  # the padding rows are never drawn
    out = _weighted_ranking(w[order], ok[order], group, options.num_groups)
    if options.smooth:  # the mesh sums; their smooth ECE in one program for every n
      out = out._replace(smooth_ece=_weighted_mesh_sums(w, c, ok))
    if options.classwise:
      out = out._replace(classwise_ece=_weighted_classwise_ece(w, probs, labels, options))
    return out

  return lax.map(one, start + jnp.arange(num_chunks, dtype=jnp.uint32))


# Resamples per call of the batched smooth ECE program: its one shape for every n and both
# schemes (blocks of resamples are whole multiples of it).
SMOOTH_RESAMPLES = 32


def _smooth_ece_of_resamples(sums: Any) -> np.ndarray:
  """float32 [B] smooth ECE (automatic bandwidth) of the resamples' mesh sums [B, 2, L + 1]."""
  sums = np.asarray(sums, np.float32)
  count = sums.shape[0]
  sums = np.concatenate([sums, np.zeros((-count % SMOOTH_RESAMPLES,) + sums.shape[1:],
                                        np.float32)])  # zero sums: a finite 0, dropped below
  # The library's batched bandwidth search: its values move from cw.smooth_ece's (a bisection,
  # the estimate's) by float32 rounding, about 1e-7 (tests/test_cli_ranking_metrics.py).
  out = [np.asarray(_smooth_ece.searched_smooth_ece(sums[i:i + SMOOTH_RESAMPLES])[1])
         for i in range(0, sums.shape[0], SMOOTH_RESAMPLES)]
  return np.concatenate(out)[:count]


def _size_class(n: int) -> int:
  """The power of two (at least 64) that ``n`` rows are padded to."""
  return max(64, 1 << max(n - 1, 0).bit_length())


def _peer_samples(model: PeerInputs, settings: Settings, scheme: str, key: jax.Array,
                  num_resamples: int) -> PeerMetrics:
  """The peer metrics [B] of ``num_resamples`` resamples of one model."""
  c = jnp.asarray(model.scores, jnp.float32)
  ok = jnp.asarray(model.correct, jnp.bool_)
  classwise = model.probs is not None and model.labels is not None and not model.real
  probs = jnp.asarray(model.probs, jnp.float32) if classwise else None
  labels = jnp.asarray(model.labels, jnp.int32) if classwise else None
  options = _PeerOptions(settings.num_bins, settings.ece_norm, settings.binning,
                         smooth=not model.real, classwise=classwise, num_groups=1)
  if scheme == "poisson":
    s = np.asarray(model.scores, np.float32)
    n = s.size
    order = np.argsort(-s, kind="stable").astype(np.int32)
    ordered = s[order]
    group = np.concatenate([[0], np.cumsum(ordered[1:] != ordered[:-1])]).astype(np.int32)
    # Rows padded to a power of two (weight 0: they add exactly 0 to every sum), so one
    # compiled program serves every n up to it with the same number of tie groups. The groups
    # are not padded: XLA's float32 sums over them (the average precisions) associate by their
    # length, so padding would move the resampled values by float32 rounding.
    size = _size_class(n)
    pad = lambda x: None if x is None else jnp.asarray(np.pad(  # noqa: E731
        np.asarray(x), [(0, size - n)] + [(0, 0)] * (np.ndim(x) - 1)))
    order = np.concatenate([order, np.arange(n, size, dtype=np.int32)])
    group = np.concatenate([group, np.full(size - n, group[-1], np.int32)])
    options = options._replace(num_groups=int(group[-1]) + 1)
    data = (pad(c), pad(ok), pad(probs), pad(labels), jnp.asarray(order), jnp.asarray(group),
            jnp.int32(n))
    jitted = _poisson_peers_jit
  else:
    data = (c, ok, probs, labels)
    jitted = _multinomial_peers_jit
  # Values one resample touches (the rows, padded ones too, their classes, the smooth ECE's
  # mesh): the host loop sizes its blocks (a static count) by them.
  size = int(data[1].shape[0]) * (1 + (probs.shape[1] if classwise else 0))
  size += 2 * (_smooth_ece._MESH_INTERVALS + 1) if options.smooth else 0

  block_elements = _runner.BLOCK_ELEMENTS
  if options.smooth:  # whole batches of the smooth ECE program per block (at least one)
    block_elements = max(1, block_elements // (SMOOTH_RESAMPLES * size)) * SMOOTH_RESAMPLES * size

  def block(start, chunk, chunks):
    out = jitted(data, key, start, options, chunks)
    if options.smooth:
      out = out._replace(smooth_ece=_smooth_ece_of_resamples(out.smooth_ece))
    return out

  return _bootstrap.run_blocks(block, num_resamples, 1, size, block_elements=block_elements)


def _as_peer_numpy(values: PeerMetrics) -> PeerMetrics:
  return PeerMetrics(*(None if v is None else np.asarray(v) for v in values))


def peer_intervals(model: PeerInputs, estimate: PeerMetrics, settings: Settings, *,
                   num_resamples: int, level: float, seed: int, resampling: str,
                   progress: Callable[[int], Any] | None = None) -> Any:
  """Percentile intervals of the peer metrics (a :class:`cwsa_jax.BootstrapResult` of
  :class:`PeerMetrics`) from the resamples ``resampling`` (the scheme the other metrics' intervals
  used: :func:`evaluation_intervals`'s) draws for ``seed``."""
  with _bootstrap.reporting(progress):
    samples = _peer_samples(model, settings, resampling, jax.random.key(seed), num_resamples)
  low, high = _percentile._interval_jit(samples, jnp.float32(level))
  return cw.BootstrapResult(estimate, _as_peer_numpy(low), _as_peer_numpy(high))


def peer_comparison(a: PeerInputs, b: PeerInputs, estimates: tuple[PeerMetrics, PeerMetrics],
                    settings: Settings, *, num_resamples: int, level: float, seed: int,
                    resampling: str, progress: Callable[[int], Any] | None = None) -> Any:
  """The paired bootstrap of the peer metrics (a :class:`cwsa_jax.PairedBootstrapResult` of
  :class:`PeerMetrics`): both models on the same resamples, as :func:`comparison`."""
  key = jax.random.key(seed)
  with _bootstrap.reporting(progress):
    samples = [_peer_samples(m, settings, resampling, key, num_resamples) for m in (a, b)]
  d = _percentile._differences_jit(*samples)
  low, high, p_value = _percentile._paired_interval_jit(d, jnp.float32(level))
  est_a, est_b = (_as_peer_numpy(e) for e in estimates)
  difference = _as_peer_numpy(_percentile._differences_jit(est_a, est_b))
  return cw.PairedBootstrapResult(est_a, est_b, difference, *map(_as_peer_numpy,
                                                                 (low, high, p_value)))


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


def _outside(e, lo, hi):
  e, lo, hi = (np.asarray(x, np.float64) for x in (e, lo, hi))
  slack = _OUTSIDE_ATOL + _OUTSIDE_RTOL * np.abs(e)
  with np.errstate(invalid="ignore"):
    return (e < lo - slack) | (e > hi + slack)


def outside_interval(estimate: Any, low: Any, high: Any) -> Any:
  """Per metric (and threshold), whether ``estimate`` lies outside [``low``, ``high``] by more
  than float32 rounding; False where any of the three is NaN. The three are alike
  :class:`IntervalMetrics` or :class:`~cwsa_jax.cli._metrics.PeerMetrics` (None stays None)."""
  return type(estimate)(*(None if e is None else _outside(e, lo, hi)
                          for e, lo, hi in zip(estimate, low, high)))


def outside_json(estimate: IntervalMetrics, low: IntervalMetrics,
                 high: IntervalMetrics, peers: Any = None,
                 only: frozenset[str] | None = None,
                 unresampled: tuple[str, ...] = ()) -> dict[str, Any]:
  """``estimate_outside_interval`` beside the ``low`` / ``high`` ends in metrics.json (true or
  false per metric, a list over the thresholds for the sweep fields; ``peers``, a
  ``(estimate, low, high)`` of the peer metrics, adds theirs; ``only``: of these metrics;
  ``unresampled``: metrics without an interval, null), and ``estimate_outside_note`` when any is
  true."""
  flags = dict(outside_interval(estimate, low, high)._asdict())
  if peers is not None:
    flags.update((k, v) for k, v in outside_interval(*peers)._asdict().items() if v is not None)
  flags.update((name, None) for name in unresampled)  # no interval: null
  if only is not None:
    flags = {k: v for k, v in flags.items() if k in only}
  out = {"estimate_outside_interval": {name: np.asarray(value).tolist() for name, value
                                       in sorted(flags.items())}}
  if any(value is not None and np.any(value) for value in flags.values()):
    out["estimate_outside_note"] = OUTSIDE_EXPLANATION[0].upper() + OUTSIDE_EXPLANATION[1:]
  return out


def outside_notes(rows: list[list[str]]) -> list[str]:
  """[:data:`OUTSIDE_NOTE`] when a table row carries :data:`OUTSIDE_MARK`, else []."""
  return [OUTSIDE_NOTE] if any(OUTSIDE_MARK in cell for row in rows for cell in row) else []


def marked(text: str, outside: Any) -> str:
  """``text`` with :data:`OUTSIDE_MARK` when ``outside``."""
  return f"{text} {OUTSIDE_MARK}" if bool(outside) else text


_marked = marked


def peer_interval_rows(intervals: Intervals) -> list[list[str]]:
  """(metric, value, low, high) rows of the peer metrics that apply (none without them)."""
  peers = intervals.peers
  if peers is None:
    return []
  outside = outside_interval(*peers)
  return [[name, _marked(f"{float(getattr(peers.estimate, name)):.5f}", getattr(outside, name)),
           f"{float(getattr(peers.low, name)):.5f}", f"{float(getattr(peers.high, name)):.5f}"]
          for name in PeerMetrics._fields if getattr(peers.estimate, name) is not None]


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
  rows += peer_interval_rows(intervals)
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
  peers = comp.peers
  if peers is not None:
    outside_peers = outside_interval(peers.difference, peers.low, peers.high)

    def peer_row(name):
      get = lambda m: float(getattr(m, name))  # noqa: E731
      cells = [f"{get(v):+.5f}" if i >= 2 else f"{get(v):.5f}" for i, v in enumerate(
          (peers.estimate_a, peers.estimate_b, peers.difference, peers.low, peers.high))]
      cells[2] = _marked(cells[2], getattr(outside_peers, name))
      return [name] + cells + [f"{get(peers.p_value):.4f}"]
    rows += [peer_row(name) for name in PeerMetrics._fields
             if getattr(peers.estimate_a, name) is not None]
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
