"""The evaluation bootstrap: every metric of the evaluation report from one sort per model.

:func:`bootstrap_evaluation` and :func:`paired_evaluation` (the command line's intervals),
and the area path of :func:`~cwsa_jax.bootstrap_ci` (``_area_options``, ``_area_samples``):
each resample is multiplicities over the samples sorted once, evaluated by the exact bucket
sums (``_bucket_sums``) and the area scan (``_area_scan``).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cwsa_jax._kernels import _dispatch
from cwsa_jax import _risk_coverage
from cwsa_jax import _stats
from cwsa_jax import _sweep
from cwsa_jax import _validation
from cwsa_jax._bootstrap._area_scan import _AreaCarry
from cwsa_jax._bootstrap._area_scan import _area_carry_zero
from cwsa_jax._bootstrap._area_scan import _area_scan
from cwsa_jax._bootstrap._area_scan import _areas_from_carry
from cwsa_jax._bootstrap._area_scan import _excess_sum
from cwsa_jax._bootstrap._area_scan import _tie_groups
from cwsa_jax._bootstrap._bucket_sums import _Evaluation
from cwsa_jax._bootstrap._bucket_sums import _Plan
from cwsa_jax._bootstrap._bucket_sums import _prepare_evaluation
from cwsa_jax._bootstrap._bucket_sums import _sweep_and_calibration
from cwsa_jax._bootstrap._bucket_sums import _weighted_bucket_sums
from cwsa_jax._bootstrap._checks import _check_common
from cwsa_jax._bootstrap._checks import _check_data
from cwsa_jax._bootstrap._checks import _check_level
from cwsa_jax._bootstrap._fast_forms import _keywords
from cwsa_jax._bootstrap._intervals import BootstrapResult
from cwsa_jax._bootstrap._intervals import PairedBootstrapResult
from cwsa_jax._bootstrap._intervals import _differences_jit
from cwsa_jax._bootstrap._intervals import _interval_jit
from cwsa_jax._bootstrap._intervals import _paired_interval_jit
from cwsa_jax._bootstrap._runner import EVALUATION_BLOCK_ELEMENTS
from cwsa_jax._bootstrap._runner import POISSON_BLOCK_ELEMENTS
from cwsa_jax._bootstrap._runner import run_blocks
from cwsa_jax._bootstrap._sampler import _RESAMPLING
from cwsa_jax._bootstrap._sampler import _indices_from_seed
from cwsa_jax._bootstrap._sampler import _poisson_block_jit
from cwsa_jax._bootstrap._sampler import _seed

RESAMPLING = ("multinomial", "poisson")
# The most samples of an evaluation bootstrap. Multinomial: 63 n < 2^31 keeps a block's
# digit sums exact int32 (a multiplicity may be as large as n). Poisson: multiplicities are at
# most 12 and every block's sum is split into (hi, lo) before the prefix sums, whose lo parts
# (below 4096 per block of 1024 samples) stay below 2^31 for n <= 2^29. A streamed bootstrap
# sums each range (fewer than 2^29 rows) apart into wide exact sums and counts
# (``_streamed``, ``_area_scan._WideAreaCarry``): 2^53 samples in all, as the mergeable states.
MAX_EVALUATION_N = {"multinomial": 1 << 25, "poisson": 1 << 29}
_MAX_STREAMED_N = 1 << 53


class EvaluationMetrics(NamedTuple):
  """The metrics of ``cwsa-jax evaluate`` with an interval (scalars, and [T] sweep fields)."""
  accuracy: Any
  ece: Any
  aurc: Any
  eaurc: Any
  augrc: Any
  coverage: Any
  selective_accuracy: Any
  cwsa: Any
  cwsa_plus: Any


def _metrics(bucket_sums, carry: _AreaCarry, excess, retained, bins, thresholds, order, plan):
  """Every metric of a resample from its exact bucket sums, its area scan's final carry and
  its n E-AURC (:func:`~cwsa_jax._bootstrap._area_scan._excess_sum`)."""
  out = _sweep_and_calibration(bucket_sums, retained, bins, thresholds, order, plan)
  out.update(_areas_from_carry(carry, plan.convention, excess))
  return out


def _evaluate(m, data, thresholds, order, plan, groups):
  """Every metric of the resample with multiplicities ``m``; ``groups``: ``_tie_groups`` of
  ``data.group_end`` (found once, outside the loop over resamples)."""
  carry = _area_scan(m, data.correct, data.group_end, _area_carry_zero(), plan.convention,
                     plan.kernels)
  excess = _excess_sum(m, data.correct, data.group_end, groups, plan.convention, plan.kernels)
  return _metrics(_weighted_bucket_sums(m, data, plan.num_buckets), carry, excess,
                  data.retained, data.bins, thresholds, order, plan)


@functools.partial(jax.jit, static_argnames=("plan",))
def _evaluation_estimate_jit(data, thresholds, order, plan):
  m = jnp.ones(data.correct.shape, jnp.int32)
  return _evaluate(m, data, thresholds, order, plan, _tie_groups(data.group_end))


@functools.partial(jax.jit, static_argnames=("plan",))
def _evaluation_poisson_jit(data, thresholds, order, ms, plan):
  groups = _tie_groups(data.group_end)
  return lax.map(lambda m: _evaluate(m, data, thresholds, order, plan, groups), ms)


def _evaluation_block(data, thresholds, order, key, start, plan, num_chunks):
  """The metrics [num_chunks, ...] of resamples start, start + 1, ..."""
  if plan.scheme == "poisson":
    n = data.correct.shape[0]
    ms = _poisson_block_jit(data.source, jnp.int32(n), key, start, num_chunks)
    return _evaluation_poisson_jit(data, thresholds, order, ms, plan)
  return _evaluation_block_jit(data, thresholds, order, key, start, plan, num_chunks)


@functools.partial(jax.jit, static_argnames=("plan", "num_chunks"), **_RESAMPLING)
def _evaluation_block_jit(data, thresholds, order, key, start, plan, num_chunks):
  n = data.correct.shape[0]
  b = start + jnp.arange(num_chunks, dtype=jnp.uint32)
  groups = _tie_groups(data.group_end)

  def one(b):
    idx = _indices_from_seed(_seed(key, b), n)
    position = idx if data.rank is None else data.rank[idx]
    m = jnp.zeros((n,), jnp.int32).at[position].add(1, mode="promise_in_bounds")
    return _evaluate(m, data, thresholds, order, plan, groups)

  return lax.map(one, b)


def _check_evaluation_options(num_bins, ece_norm, aurc_convention, normalize, resampling) -> int:
  """Checks the options of an evaluation bootstrap; returns ``num_bins`` as an int."""
  _stats.check_normalize(normalize)
  if aurc_convention not in ("step", "trapezoid"):
    raise ValueError(f"aurc_convention must be 'step' or 'trapezoid', got {aurc_convention!r} "
                     "(bootstrap_ci handles the published code's convention)")
  if ece_norm not in ("l1", "l2", "max"):
    raise ValueError(f"ece_norm must be 'l1', 'l2' or 'max', got {ece_norm!r}")
  if resampling not in RESAMPLING:
    raise ValueError(f"resampling must be 'multinomial' or 'poisson', got {resampling!r}")
  return _validation.positive_int(num_bins, "num_bins")


def _check_evaluation_data(confidences, correct, name: str):
  """Concrete [n] confidences in [0, 1] and boolean correctness."""
  c, k = _check_data(confidences, correct)
  if not _validation.is_concrete(c, k):
    raise TypeError(f"{name} runs on the host: call it on concrete arrays")
  if k.dtype != jnp.bool_:
    raise ValueError(f"{name} needs boolean (0/1) correctness")
  return c, k


def bootstrap_evaluation(confidences, correct, thresholds, *, key, num_resamples: int = 1000,
                         level: float = 0.95, num_bins: int = 15, ece_norm: str = "l1",
                         aurc_convention: str = "step", normalize: str = "retained",
                         resampling: str = "multinomial") -> BootstrapResult:
  """Percentile intervals of every metric of the evaluation report, from one sort.

  With ``resampling="multinomial"``, the same resamples as :func:`bootstrap_ci`
  for the same ``key`` (resample b draws the indices I_b of the module
  docstring); with ``"poisson"``, the Poisson bootstrap: resample b gives input
  row r the multiplicity m_br ~ Poisson(1) of :func:`_poisson_multiplicities`,
  independently per row, so the resample's size varies around n and shards of
  the data can be resampled apart (each row's multiplicity depends only on
  ``key``, b and its row number). It needs no gather or scatter of indices,
  and its intervals agree with the multinomial ones as n grows (Hanley and
  MacGibbon, 2006; Chamandy et al., 2012). Each resample is evaluated without sorting
  or binning anything again: the sweep at ``thresholds`` and the equal-width
  ECE family (``num_bins`` bins, ``ece_norm`` as :func:`~cwsa_jax.ece`'s
  ``norm``) come from one pass of the sweep's exact bucket sums over the
  merged grid of thresholds and bin edges, so they equal the values of
  :func:`~cwsa_jax.sweep` and :func:`~cwsa_jax.ece` on the gathered resample
  (to float32 rounding of the last divisions); AURC, AUGRC and E-AURC
  (``"step"`` or ``"trapezoid"``) come from the resample's multiplicities
  over the samples sorted once by decreasing confidence, summed in float32
  (a relative error of a few 1e-7; E-AURC from the exact differences to each
  resample's oracle, as :func:`~cwsa_jax.eaurc`, so also relative to a small
  E-AURC). Each resample costs O(n).

  Args:
    confidences: [n] confidences in [0, 1] (concrete: this runs on the host).
    correct: [n] boolean correctness.
    thresholds: [T] thresholds in [0, 1).
    key, num_resamples, level: as in :func:`bootstrap_ci`.
    num_bins, ece_norm: the ECE's equal-width bins and norm (``"l1"``, ``"l2"``, ``"max"``).
    aurc_convention: ``"step"`` or ``"trapezoid"`` (the published code's
      convention depends on the order of tied samples: use :func:`bootstrap_ci`).
    normalize: the sweep's CWSA normalisation.
    resampling: ``"multinomial"`` (n indices drawn with replacement) or ``"poisson"``.

  Returns:
    :class:`BootstrapResult` whose fields are :class:`EvaluationMetrics`
    (``accuracy``, ``ece``, ``aurc``, ``eaurc``, ``augrc``, and the sweep's
    ``coverage``, ``selective_accuracy``, ``cwsa``, ``cwsa_plus`` [T]).
  """
  run = _EvaluationRun.prepare(confidences, correct, thresholds, num_bins, ece_norm,
                               aurc_convention, normalize, resampling, "bootstrap_evaluation")
  key, num_resamples, _ = _check_common(key, num_resamples, 1, run.n)
  level = _check_level(level)
  estimate = EvaluationMetrics(**run.estimate())
  samples = run.resample(lambda start, chunks: run.block(key, start, chunks), num_resamples)
  low, high = _interval_jit(samples, jnp.float32(level))
  return BootstrapResult(estimate, EvaluationMetrics(**low), EvaluationMetrics(**high))


class _EvaluationRun(NamedTuple):
  """One model's data of an evaluation bootstrap, sorted and bucketed once."""
  data: _Evaluation
  thresholds: jax.Array
  order: jax.Array  # of the thresholds
  plan: _Plan

  @classmethod
  def prepare(cls, confidences, correct, thresholds, num_bins, ece_norm, aurc_convention,
              normalize, resampling, name: str,
              kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> "_EvaluationRun":
    """Checks the options and data (``name`` in the errors), then sorts and buckets
    (``kernels``: the area scan's forms)."""
    num_bins = _check_evaluation_options(num_bins, ece_norm, aurc_convention, normalize,
                                         resampling)
    c, k = _check_evaluation_data(confidences, correct, name)
    n = c.shape[0]
    if n >= MAX_EVALUATION_N[resampling]:
      raise ValueError(f"{name} takes n < {MAX_EVALUATION_N[resampling]} samples "
                       f"with {resampling} resampling, got {n}: use bootstrap_ci")
    t = _validation.as_thresholds(thresholds)
    order, sorted_t = _sweep.sorted_thresholds(t)
    data, num_buckets = _prepare_evaluation(np.asarray(c, np.float32), np.asarray(k),
                                            np.asarray(sorted_t), num_bins, resampling)
    plan = _Plan(num_buckets, t.shape[0], num_bins, ece_norm, aurc_convention, normalize,
                 resampling, kernels)
    return cls(data, t, order, plan)

  @property
  def n(self) -> int:
    return self.data.correct.shape[0]

  def estimate(self) -> dict:
    return _evaluation_estimate_jit(self.data, self.thresholds, self.order, self.plan)

  def block(self, key, start, num_chunks) -> dict:
    """The metrics [num_chunks, ...] of resamples start, start + 1, ..."""
    return _evaluation_block(self.data, self.thresholds, self.order, key, start, self.plan,
                             num_chunks)

  def resample(self, block: Callable, num_resamples: int):
    """``block(start, num_chunks)`` over the resamples in host blocks (:func:`run_blocks`)."""
    elements = (POISSON_BLOCK_ELEMENTS if self.plan.scheme == "poisson"
                else EVALUATION_BLOCK_ELEMENTS)
    return run_blocks(lambda start, size, chunks: block(start, chunks), num_resamples, 1,
                      self.n, block_elements=elements)


def paired_evaluation(confidences_a, correct_a, confidences_b, correct_b, thresholds, *, key,
                      num_resamples: int = 1000, level: float = 0.95, num_bins: int = 15,
                      ece_norm: str = "l1", aurc_convention: str = "step",
                      normalize: str = "retained",
                      resampling: str = "multinomial") -> PairedBootstrapResult:
  """:func:`paired_bootstrap` of every metric of the evaluation report, one sort per model.

  Each model is sorted and bucketed once, as in :func:`bootstrap_evaluation`,
  and both get the same resamples: with ``"multinomial"`` the indices I_b of
  :func:`paired_bootstrap` (each model's multiplicities over its own sorted
  order), with ``"poisson"`` the same multiplicity m_br per input row. With
  theta*_b(a) and theta*_b(b) as :func:`bootstrap_evaluation` computes them,
  d*_b = theta*_b(a) - theta*_b(b) (exactly 0 where they are equal), and the
  interval and p-value are :func:`paired_bootstrap`'s. With multinomial
  resampling the values are those of ``paired_bootstrap`` of the same metrics
  to float32 rounding, at O(n) per resample instead of a sort.

  Args:
    confidences_a, correct_a, confidences_b, correct_b: as in
      :func:`paired_bootstrap` (boolean correctness, concrete arrays).
    thresholds, key, num_resamples, level, num_bins, ece_norm, aurc_convention,
      normalize, resampling: as in :func:`bootstrap_evaluation`.

  Returns:
    :class:`PairedBootstrapResult` whose fields are :class:`EvaluationMetrics`.

  Raises:
    ValueError: as :func:`bootstrap_evaluation`, and when the models' n differ.
  """
  options = (thresholds, num_bins, ece_norm, aurc_convention, normalize, resampling,
             "paired_evaluation")
  run_a = _EvaluationRun.prepare(confidences_a, correct_a, *options)
  run_b = _EvaluationRun.prepare(confidences_b, correct_b, *options)
  if run_a.n != run_b.n:
    raise ValueError(f"models a and b must be scored on the same samples: got n = {run_a.n} "
                     f"and n = {run_b.n}")
  key, num_resamples, _ = _check_common(key, num_resamples, 1, run_a.n)
  level = _check_level(level)
  est_a, est_b = run_a.estimate(), run_b.estimate()
  samples = run_a.resample(
      lambda start, chunks: (run_a.block(key, start, chunks), run_b.block(key, start, chunks)),
      num_resamples)
  d = _differences_jit(*samples)
  low, high, p_value = _paired_interval_jit(d, jnp.float32(level))
  return PairedBootstrapResult(*(EvaluationMetrics(**x) for x in (
      est_a, est_b, _differences_jit(est_a, est_b), low, high, p_value)))


_AREAS = ((_risk_coverage.aurc, "aurc"), (_risk_coverage.augrc, "augrc"),
          (_risk_coverage.eaurc, "eaurc"), (_risk_coverage.risk_coverage_summary, None))


def _area_options(fn: Callable, correct: jax.Array) -> tuple[str | None, str] | None:
  """(area, convention) when ``fn`` is one of the areas (None: the summary of all three),
  or a keyword-only partial of one, with a convention the area scan computes and boolean
  correctness the evaluation bootstrap sums exactly; else None."""
  if correct.dtype != jnp.bool_ or correct.shape[0] >= MAX_EVALUATION_N["multinomial"]:
    return None
  for metric, name in _AREAS:
    keywords = _keywords(fn, metric, {"convention"})
    if keywords is not None:
      convention = keywords.get("convention", "step")
      return (name, convention) if convention in ("step", "trapezoid") else None
  return None


def _area_samples(name: str | None, convention: str, *models, key, num_resamples: int,
                  kernels: _dispatch.Kernels = _dispatch.DEFAULT):
  """The areas [B] of :func:`bootstrap_ci`'s resamples of one model ``(confidences,
  correct)``, or the differences of two models' (:func:`paired_bootstrap`'s), from the
  evaluation bootstrap's one sort per model and area scan (its sweep and bins kept minimal);
  ``name`` None: the summary of all three areas."""
  runs = [_EvaluationRun.prepare(c, k, np.array([0.5], np.float32), 1, "l1", convention,
                                 "retained", "multinomial", "bootstrap_ci", kernels)
          for c, k in models]

  def areas(metrics):
    if name is None:
      return _risk_coverage.RiskCoverageSummary(metrics["aurc"], metrics["augrc"],
                                                metrics["eaurc"])
    return metrics[name]

  def block(start, chunks):
    values = [areas(run.block(key, start, chunks)) for run in runs]
    return values[0] if len(values) == 1 else _differences_jit(*values)

  return runs[0].resample(block, num_resamples)
