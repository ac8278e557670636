"""Subgroup analysis: the fused threshold sweep per group, in one call.

Each sample is assigned the segment ``group * (T + 1) + bucket`` (times the
correctness split of ``_stats``), so one pass of the sweep's pipeline
(``_sweep.bucket_sums``) gives every group's per-bucket statistics; a reverse
cumulative sum along the bucket axis of each group then gives the retained-set
sums of every (group, threshold) pair. The cost is that of one :func:`~cwsa_jax.sweep` plus
a segment table num_groups times larger, not num_groups passes over the data.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from cwsa_jax import _public
from cwsa_jax import _stats
from cwsa_jax import _sweep
from cwsa_jax import _threshold_order
from cwsa_jax import _validation
from cwsa_jax._sweep import SweepResult

FIELDS = _sweep.METRIC_FIELDS


def _exact_group_sums(confidences, correct, groups, sorted_thresholds, *, num_groups):
  """Exact suffix :class:`~cwsa_jax._stats.Sums` [G, T + 1] along each group's bucket axis."""
  hi, lo = _sweep.bucket_sums(confidences, correct, sorted_thresholds, groups=groups,
                              num_groups=num_groups)
  return _sweep.sums_from_bucket_sums(hi, lo)


def _group_segments(confidences, correct, groups, sorted_thresholds, *, num_groups):
  """Each sample's segment ``group * (T + 1) + bucket`` (out-of-range groups: out of range)."""
  del correct
  num_buckets = sorted_thresholds.shape[0] + 1
  bucket = _sweep.bucket_ids(confidences, sorted_thresholds)
  valid = (groups >= 0) & (groups < num_groups)
  ids = jnp.where(valid, groups * num_buckets + bucket, num_groups * num_buckets)
  return ids, (num_groups, num_buckets), 0


@functools.partial(jax.jit, static_argnames=("num_groups", "normalize"))
def _sweep_by_group_1d(confidences, correct, groups, thresholds, *, num_groups, normalize):
  num_thresholds = thresholds.shape[0]
  order, sorted_thresholds = _sweep.sorted_thresholds(thresholds)
  # Exact sums; their derivative in c (and kappa) is the float sum over each retained set.
  all_sums = _stats.exact_sums(
      functools.partial(_exact_group_sums, num_groups=num_groups),
      functools.partial(_group_segments, num_groups=num_groups),
      confidences, correct, groups, sorted_thresholds)
  # Entry 0 of each group's suffix is the whole group; threshold j (sorted) retains 1 + j onwards.
  sizes = all_sums.count[:, 0]
  sums = _stats.Sums(*(x[:, 1:] for x in all_sums))
  nonempty = sizes > 0
  safe_sizes = jnp.where(nonempty, sizes, 1.0)[:, None]
  metrics = _stats.metrics_from_sums(sums, thresholds[order], 1)
  metrics = metrics._replace(coverage=_stats.divide((sums.count, safe_sizes))[0])
  inverse = jnp.zeros_like(order).at[order].set(jnp.arange(num_thresholds, dtype=order.dtype))
  # A group with no samples has nothing to measure: NaN (not an input error).
  fields = [jnp.where(nonempty[:, None], m[:, inverse], jnp.nan) for m in metrics]
  fields = _validation.poison(fields, items=_validation.bad_threshold(thresholds))
  return _stats.renormalize(SweepResult(thresholds, *fields), normalize)


@_threshold_order.at("thresholds")
@_public.entry
def sweep_by_group(confidences, correct, groups, thresholds, *, num_groups: int,
                   normalize: str = "retained") -> SweepResult:
  """:func:`~cwsa_jax.sweep` computed separately for every group, in one fused call.

  For group g with samples G_g and threshold tau_t, S_{g,t} = {i in G_g : c_i >= tau_t}:

  .. math::

    \\mathrm{coverage}_{g,t} = \\frac{|S_{g,t}|}{|G_g|}, \\quad
    \\mathrm{CWSA}_{g,t} = \\frac{1}{|S_{g,t}|} \\sum_{S_{g,t}} \\phi_i (2\\kappa_i - 1),
    \\quad \\mathrm{CWSA}^+_{g,t} = \\frac{1}{|S_{g,t}|} \\sum_{S_{g,t}} \\phi_i \\kappa_i ,

  i.e. row g equals ``sweep(confidences[groups == g], correct[groups == g],
  thresholds)``. A group with no samples has every field NaN (there is
  nothing to measure; ``sweep`` would reject it), so :func:`group_gap`
  ignores it. Within a non-empty group an empty retained set gives CWSA =
  CWSA+ = 0 and selective accuracy NaN, as in ``sweep``.

  Groups are, e.g., true classes or data slices. One jitted call, cost about
  one ``sweep`` plus a segment table num_groups x (T + 1) long (its memory,
  about 50 G (T + 1) bytes for bool ``correct``, is the limit for very many
  groups and thresholds); the sums are exact as in ``sweep``.

  Args:
    confidences: [..., n] confidences in [0, 1]; leading axes are batch axes.
    correct: [..., n] bool or 0/1, or graded correctness kappa in [0, 1].
    groups: [..., n] integer group ids in [0, num_groups) (same shape as
      ``confidences``; integral floats are accepted).
    thresholds: [T] thresholds in [0, 1), any order.
    num_groups: static number of groups G >= 1.
    normalize: ``"retained"`` (default) or ``"all"`` (CWSA divided by the
      group size, i.e. coverage x CWSA per group).

  Returns:
    :class:`~cwsa_jax.SweepResult` with ``thresholds`` [T] and the other
    fields [..., G, T].

  Raises:
    ValueError: on concrete inputs with NaN, values outside [0, 1], group ids
      out of range or non-integer, num_groups < 1, mismatched shapes, or no
      samples. Inside a user's ``jit`` / ``vmap`` invalid values (including
      out-of-range group ids) give NaN outputs (the invalid row, or the
      column of an invalid threshold).

  Gradients: as :func:`~cwsa_jax.sweep` (CWSA and CWSA+ exact almost
  everywhere in the confidences, coverage and selective accuracy piecewise
  constant).

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax import sweep_by_group
    >>> r = sweep_by_group(jnp.array([0.9, 0.6, 0.8, 0.55]), jnp.array([True, False, True, True]),
    ...                    jnp.array([0, 0, 1, 1]), jnp.array([0.5, 0.7]), num_groups=2)
    >>> print(r.coverage.tolist(), [[round(float(x), 4) for x in row] for row in r.cwsa])
    [[1.0, 0.5], [1.0, 0.5]] [[0.3, 0.6667], [0.35, 0.3333]]
  """
  _stats.check_normalize(normalize)
  num_groups = _validation.positive_int(num_groups, "num_groups")
  if not _validation.is_concrete(confidences, correct, groups):
    return _sweep_by_group_traced(confidences, correct, groups, thresholds,
                                  num_groups=num_groups, normalize=normalize)
  return _sweep_by_group(confidences, correct, groups, thresholds, num_groups=num_groups,
                         normalize=normalize)


def _sweep_by_group(confidences, correct, groups, thresholds, *, num_groups: int,
                    normalize: str) -> SweepResult:
  confidences, correct, rows = _validation.samples(confidences, correct)
  groups, group_flag = _validation.labels(groups, num_groups, "groups")
  thresholds, _ = _validation.thresholds(thresholds)  # invalid ones: NaN in the kernel
  _validation.check_same_leading_shape(confidences, groups, "confidences", "groups")
  if group_flag is not None:
    rows = _validation.either(rows, jnp.any(group_flag, axis=-1))
  fn = functools.partial(_sweep_by_group_1d, num_groups=num_groups, normalize=normalize)
  for _ in range(confidences.ndim - 1):
    fn = jax.vmap(fn, in_axes=(0, 0, 0, None))
  result = fn(confidences, correct, groups, thresholds)
  if rows is None:
    return result
  return SweepResult(result.thresholds, *_validation.poison(tuple(result[1:]), rows=rows))


# Traced samples: the value checks become flags, compiled with the kernel (see sweep).
_sweep_by_group_traced = jax.jit(_sweep_by_group, static_argnames=("num_groups", "normalize"))


@_public.entry
def group_gap(result: SweepResult, field: str = "cwsa") -> jax.Array:
  """Gap between the best and the worst group at each threshold.

  .. math::

    \\mathrm{gap}_t = \\max_g m_{g,t} - \\min_g m_{g,t},

  over the groups where ``m`` is not NaN (empty groups, and for selective
  accuracy groups with nothing retained). NaN where no group has a value.

  Args:
    result: a :func:`sweep_by_group` result (fields [..., G, T]).
    field: ``"cwsa"`` (default), ``"cwsa_plus"``, ``"selective_accuracy"`` or
      ``"coverage"``.

  Returns:
    [..., T] array.

  Examples:
    >>> import jax.numpy as jnp
    >>> from cwsa_jax import sweep_by_group, group_gap
    >>> r = sweep_by_group(jnp.array([0.9, 0.6, 0.8, 0.55]), jnp.array([True, False, True, True]),
    ...                    jnp.array([0, 0, 1, 1]), jnp.array([0.5, 0.7]), num_groups=3)
    >>> print([round(float(x), 4) for x in group_gap(r)])
    [0.05, 0.3333]
  """
  if field not in FIELDS:
    raise ValueError(f"field must be one of {FIELDS}, got {field!r}")
  values = jnp.asarray(getattr(result, field))
  if values.ndim < 2:
    raise ValueError(f"expected a per-group result with fields [..., G, T], got shape {values.shape}")
  present = ~jnp.isnan(values)
  high = jnp.max(jnp.where(present, values, -jnp.inf), axis=-2)
  low = jnp.min(jnp.where(present, values, jnp.inf), axis=-2)
  return jnp.where(jnp.any(present, axis=-2), high - low, jnp.nan)

