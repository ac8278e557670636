"""Per-bucket exact sums on GPUs for many thresholds: one sort, then prefix sums at the bucket edges.

For more buckets than ``_dense`` handles (a sweep of T >= 64 thresholds), the
scatter-adds of ``_exact.segment_sums`` are the slow part on a GPU (several
times one ``lax.sort`` of the samples; docs/performance.md). Here the samples
are sorted once by the int32 key
``confidence bits << 1 | correct`` (the bits of a float32 in [0, 1] order like
its value), so bucket ``b`` (``t_b <= c < t_{b+1}``) is the contiguous range
of positions ``[q_b, q_{b+1})`` with ``q_b`` the number of samples below
``t_b`` (one ``searchsorted`` per threshold). Its sums are differences of
prefix sums:

.. math::

  S_b = P(q_{b+1}) - P(q_b), \\qquad P(q) = \\sum_{i < q} x_i,

with the columns ``x`` of ``_stats.segment_columns`` (count, the 12-bit
digits of ``u = (1 - c) 2^24``, and the same for the correct samples). Every
``P(q)`` is exact: the sorted samples are cut into chunks of 4096, whose
column sums (below 2^24) are carried over the chunks in the ``(hi, lo)``
base-4096 form of ``_exact``, and the chunk that holds ``q`` adds its first
``q mod 4096`` entries. The result is bit for bit the scatter path's.

Used on CUDA GPUs for binary samples in one row with more than
``_dense.MAX_BUCKETS`` buckets and no groups, mask or given buckets; every
other case, and every other backend, keeps the scatter path. Tests run it on
the CPU (``Kernels(platform="cuda")``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from cwsa_jax._kernels import _dense
from cwsa_jax._kernels import _dispatch
from cwsa_jax import _exact
from cwsa_jax._kernels import _sort
from cwsa_jax import _validation

# Samples per chunk: a chunk's column sums stay <= 4096 * 4096 = 2^24.
_CHUNK = 4096
_ABOVE_ONE = 0x3F800001  # a key above every confidence key (1.0 is 0x3F800000)


def applies(confidences: jax.Array, correct: jax.Array, num_buckets: int, *,
            kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> bool:
  """Whether :func:`bucket_sums` handles these samples (static shapes and dtypes only; and
  ``kernels.sorted_sums``)."""
  n = confidences.shape[-1]
  return (kernels.sorted_sums and correct.dtype == jnp.bool_ and confidences.ndim == 1 and n >= 1
          and n < (1 << 31) - 2 * _CHUNK and num_buckets > _dense.MAX_BUCKETS)


def _column_sums(packed: jax.Array, keep: jax.Array | None = None) -> jax.Array:
  """int32 [6, ...] sums over the last axis of the packed samples' columns (where ``keep``):
  count, correct, u_hi, u_lo, and u_hi, u_lo of the correct ones (one reduction each, fused)."""
  correct = packed & 1
  c = lax.bitcast_convert_type(packed >> 1, jnp.float32)
  hi, lo = _exact.grid_columns(1.0 - c)
  columns = [jnp.ones_like(correct), correct, hi, lo, hi * correct, lo * correct]
  if keep is not None:
    columns = [jnp.where(keep, x, 0) for x in columns]
  return jnp.stack([jnp.sum(x, axis=-1) for x in columns])


def bucket_sums(confidences: jax.Array, correct: jax.Array,
                sorted_thresh: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Exact per-bucket ``(hi, lo)`` [T + 1, 6] of binary samples [n]: the sweep's bucket sums.

  Bucket ``b`` holds the samples with exactly ``b`` of the ascending
  ``sorted_thresh`` at or below ``c``; the layout is that of
  ``_stats.segment_columns`` (segment ``2 bucket + correct``). Samples whose
  confidence is NaN or outside [0, 1] are left out.
  """
  n = confidences.shape[0]
  num_chunks = n // _CHUNK + 1  # the chunk holding position n exists
  confidences = lax.stop_gradient(confidences)  # integer sums: callers define the derivative
  packed = (_sort.float_key(confidences) << 1) | correct.astype(jnp.int32)
  # Confidences NaN or outside [0, 1] are left out, as on the scatter path: they sort
  # last with the padding, above every bucket's end (the key _ABOVE_ONE).
  never = jnp.iinfo(jnp.int32).max
  packed = jnp.where(_validation.bad_unit(confidences), never, packed)
  packed = jnp.pad(packed, (0, num_chunks * _CHUNK - n), constant_values=never)
  chunks = lax.sort(packed).reshape(num_chunks, _CHUNK)
  # Thresholds above 1 (+inf included) lie above every sample.
  t_key = jnp.where(sorted_thresh > 1.0, _ABOVE_ONE, _sort.float_key(sorted_thresh))
  t_key = jnp.concatenate([t_key, jnp.full((1,), _ABOVE_ONE, jnp.int32)])
  below = jnp.searchsorted(chunks.reshape(-1), t_key << 1, side="left").astype(jnp.int32)
  q = jnp.concatenate([jnp.zeros((1,), jnp.int32), below])
  # Exclusive running sums of the chunk totals, in (hi, lo) form: [6, chunks].
  totals_hi, totals_lo = _exact.split(_column_sums(chunks))
  before = lambda x: jnp.cumsum(x, axis=1) - x  # noqa: E731
  run_hi, run_lo = before(totals_hi), before(totals_lo)
  chunk, offset = q // _CHUNK, q % _CHUNK
  head = jnp.arange(_CHUNK, dtype=jnp.int32) < offset[:, None]  # [T + 2, C]
  partial = _column_sums(chunks[chunk], head)  # [6, T + 2]
  p_hi, p_lo = _exact.split(partial)
  p_hi, p_lo = p_hi + run_hi[:, chunk], p_lo + run_lo[:, chunk]  # P(q) = hi 4096 + lo
  hi, lo = _exact.canonical(p_hi[:, 1:] - p_hi[:, :-1], p_lo[:, 1:] - p_lo[:, :-1])  # [6, T + 1]
  # count, correct, u_hi, u_lo, correct u_hi, correct u_lo -> wrong (count, u_hi, u_lo), right (...)
  wrong = _exact.canonical(hi[jnp.array([0, 2, 3])] - hi[jnp.array([1, 4, 5])],
                           lo[jnp.array([0, 2, 3])] - lo[jnp.array([1, 4, 5])])
  right = hi[jnp.array([1, 4, 5])], lo[jnp.array([1, 4, 5])]
  return (jnp.concatenate([wrong[0], right[0]]).T, jnp.concatenate([wrong[1], right[1]]).T)

