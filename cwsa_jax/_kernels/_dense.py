"""Per-bucket exact sums on NVIDIA GPUs: one pass, threshold masks times digit columns.

On a GPU the scatter-adds of ``_exact.segment_sums`` contend for the few
buckets of a sweep or an ECE (every sample adds into one of 2 (T + 1)
segments). For few buckets this module computes the same exact integers
without a scatter. With the rows ``r_0 = -inf < r_1 <= ... <= r_T`` (the
sorted thresholds, or the interior bin edges), each chunk of samples gives
the per-row sums

.. math::

  G_{r,j} = \\sum_i [c_i \\ge r_r] \\, x_{ij}

of the columns x: the count, ``u_hi = u >> 12`` and ``u_lo = u & 4095`` of
``u = (1 - c) 2^24``, and the same three times ``correct``. Bucket ``b`` (the
samples with exactly ``b`` rows above ``r_0`` at or below ``c``) is then
``G_b - G_{b+1}``, an exact int32 difference, brought to the ``(hi, lo)``
layout of ``_stats.segment_columns``: bit for bit the sums of the scatter
path, so results and states do not depend on the backend.

Two ways to form G (:data:`FORMS`, picked per mask height by the launch table of
``_dispatch.Kernels``, :data:`~cwsa_jax._kernels._dispatch.DENSE_LAUNCH` by default):

* no product ("lanes", "unrolled"): each thread keeps float32 accumulators
  per row and column for every sample slot it holds and adds the mask times
  each column, one fused multiply-add per row and column; every accumulator
  stays below 2^24 (at most 1023 samples each), so it is exact, and
  becomes int32 once per program before the sum over the threads. At most 32
  rows per program ("unrolled" shares more rows evenly among programs over
  the same samples). "unrolled" also issues several loads per thread before their
  sums (more bytes in flight) and compares only the rows that can hold
  samples (T + 1 of the 16 for a sweep of 10 thresholds);
* "bits", for more rows: one matrix product ``M @ X`` per step on the tensor
  cores, of the 0/1 mask M [R, step] and the columns' base-64 digits X
  [step, 16], each digit written as the bfloat16 bit pattern of 128 + digit,
  every chunk sum of at most 2^16 samples below 2^24.

Which launch wins on which GPU, and by how much, is measured by
``benchmarks/gpu_choices.py`` and reported in ``docs/performance.md``.

The kernels (Pallas, Triton backend) read each confidence and correctness
once; rows of samples (leading axes, ``vmap``) are one launch. They are used
for binary correctness, at most :data:`MAX_BUCKETS` buckets and no mask,
groups or given buckets; everything else, and every other backend, keeps the
scatter path. Tests run them on the CPU through Pallas' interpreter
(``Kernels(platform="cuda", interpret=True)``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from cwsa_jax._kernels import _dispatch
from cwsa_jax import _exact
from cwsa_jax import _mesh

# Buckets (T + 1) the dense kernel handles: its mask has at most 64 rows.
MAX_BUCKETS = 64
# Digit columns of X: count, 4 digits of u, and the same times correct (10), padded to 16.
_WIDTH = 16
_USED = 10
# Most samples per program: its sums stay below 192 * 2^16 < 2^24, exact in float32.
_PER_PROGRAM = 1 << 16


def applies(confidences: jax.Array, correct: jax.Array, num_buckets: int, *,
            kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> bool:
  """Whether :func:`bucket_sums` handles these samples (static shapes, dtypes and mesh axes;
  and ``kernels.dense``).

  Samples that vary over the mesh axes of an enclosing ``shard_map`` keep the
  scatter path: the kernel has not been run on a GPU there.
  """
  return (kernels.dense and correct.dtype == jnp.bool_ and confidences.shape[-1] >= 1
          and 2 <= num_buckets <= MAX_BUCKETS and not _mesh.manual_axes(confidences))


def _num_rows(num_buckets: int) -> int:
  return max(16, 1 << (num_buckets - 1).bit_length())


# Per digit column j: (shift, mask) of w = u | 2^25 (bit 25 gives the count); columns
# j >= 5 take w of the correct samples only.
_SHIFTS = (25, 18, 12, 6, 0) * 2 + (0,) * (_WIDTH - _USED)
_MASKS = (1, 127, 63, 63, 63) * 2 + (0,) * (_WIDTH - _USED)
FORMS = ("bits", "lanes", "unrolled")
_LANES_FORMS = ("lanes", "unrolled")
LANES_MAX_ROWS = 32


def _step(c_ref, k_ref, i, *, first, n, block, unit, bounded=True):
  """Step ``i``'s confidences, correctness and confidences as compared (NaN: below every row).

  ``bounded=False``: the step lies inside ``[0, n)`` (no masked loads).
  """
  from jax.experimental.pallas import triton as plgpu  # noqa: PLC0415 (GPU module, on use)
  start = i * block
  if bounded:
    # The last program's block runs past n: masked loads, and NaN (below no row) there.
    valid = first + start + lax.broadcasted_iota(jnp.int32, (block,), 0) < n
    c = plgpu.load(c_ref.at[pl.ds(start, block)], mask=valid, other=0.0)
    k = plgpu.load(k_ref.at[pl.ds(start, block)], mask=valid, other=False)
  else:
    valid = None
    c, k = c_ref[pl.ds(start, block)], k_ref[pl.ds(start, block)]
  if unit:  # confidences NaN or outside [0, 1] are left out, as on the scatter path
    inside = _clip(c) == c  # NaN: False
    valid = inside if valid is None else valid & inside
  if valid is None:
    return c, k, c
  # A NaN left in c would make the lanes forms' columns NaN, and 0 * NaN poisons the thread's
  # accumulators: the samples left out are read as 0.
  return jnp.where(valid, c, 0.0), k, jnp.where(valid, c, jnp.nan)


def _clip(c: jax.Array) -> jax.Array:
  return jnp.minimum(jnp.maximum(c, 0.0), 1.0)


def _units(c: jax.Array) -> jax.Array:
  """``u = (1 - clip(c, 0, 1)) 2^24``, int32 in [0, 2^24]."""
  return ((1.0 - _clip(c)) * 16777216.0).astype(jnp.int32)


def _bits_kernel(rows_ref, c_ref, k_ref, out_ref, *, n, block, steps, unit):
  step = functools.partial(_step, c_ref, k_ref, first=pl.program_id(1) * (block * steps), n=n,
                           block=block, unit=unit)
  rows = rows_ref[...]
  lane = lax.broadcasted_iota(jnp.int32, (1, _WIDTH), 1)
  shifts = jnp.zeros((1, _WIDTH), jnp.int32)
  masks = jnp.zeros((1, _WIDTH), jnp.int32)
  for j in range(_USED):
    shifts = jnp.where(lane == j, _SHIFTS[j], shifts)
    masks = jnp.where(lane == j, 0 if j == 0 else _MASKS[j], masks)
  times_correct = lane >= _USED // 2
  one, zero = jnp.ones((), jnp.bfloat16), jnp.zeros((), jnp.bfloat16)

  def body(i, acc):
    c, k, compared = step(i)
    w = _units(c) | (1 << 25)
    source = jnp.where(times_correct, jnp.where(k, w, 0)[:, None], w[:, None])
    digits = lax.shift_right_logical(source, shifts) & masks
    # Digit d as the bfloat16 bit pattern of 128 + d: no conversion instructions; the count
    # column holds 128 per sample, the offset taken off the others after the kernel.
    digits = lax.bitcast_convert_type((digits | 0x4300).astype(jnp.int16), jnp.bfloat16)
    mask = jnp.where(rows[:, None] <= compared[None, :], one, zero)  # [R, block]
    return acc + jnp.dot(mask, digits, preferred_element_type=jnp.float32)

  acc = lax.fori_loop(0, steps, body, jnp.zeros((rows.shape[0], _WIDTH), jnp.float32))
  out_ref[...] = acc.astype(jnp.int32)


def _lanes_columns(c: jax.Array, k: jax.Array) -> tuple[jax.Array, ...]:
  """The lanes forms' five float32 columns: count + 1024 correct, u >> 12, u & 4095, the last
  two times correct (integers, exact in float32 sums below 2^24)."""
  # In float32, exactly: 1 - clip(c) is a multiple of 2^-24, so u is an integer; hi and lo
  # are u >> 12 and u & 4095 of _units (no float-int conversions).
  x = 1.0 - _clip(c)
  hi = jnp.floor(x * 4096.0)
  lo = x * 16777216.0 - 4096.0 * hi
  right = jnp.where(k, 1.0, 0.0)
  return 1.0 + 1024.0 * right, hi, lo, right * hi, right * lo


def _lanes_layout(counts, hi, lo, right_hi, right_lo) -> dict:
  """The lanes forms' int32 sums by column of ``_kernel``'s digit layout (64 * 0 + sum).

  Per thread at most ``steps`` < 1024 samples: count and correct count apart in one column.
  """
  return {0: counts & 1023, 2: hi, 4: lo, 5: counts >> 10, 7: right_hi, 9: right_lo}


def _lanes_kernel(rows_ref, c_ref, k_ref, out_ref, *, n, block, steps, unit):
  step = functools.partial(_step, c_ref, k_ref, first=pl.program_id(1) * (block * steps), n=n,
                           block=block, unit=unit)
  rows = rows_ref[...]

  def body(i, acc):
    c, k, compared = step(i)
    above = jnp.where(rows[:, None] <= compared[None, :], 1.0, 0.0)  # [R, block]
    return tuple(a + above * x[None, :] for a, x in zip(acc, _lanes_columns(c, k)))

  zeros = jnp.zeros((rows.shape[0], block), jnp.float32)
  acc = lax.fori_loop(0, steps, body, (zeros,) * 5)
  lane = lax.broadcasted_iota(jnp.int32, (1, _WIDTH), 1)
  out = jnp.zeros((rows.shape[0], _WIDTH), jnp.int32)
  for j, x in _lanes_layout(*(a.astype(jnp.int32) for a in acc)).items():
    out = jnp.where(lane == j, jnp.sum(x, axis=1)[:, None], out)
  out_ref[...] = out


def _rows_kernel(rows_ref, c_ref, k_ref, out_ref, *, n, block, steps, unit, num_rows, live,
                 lanes):
  """The "lanes" sums with one 1-D accumulator per row and column (rows unrolled): every
  thread computes its samples' columns once, whatever the number of rows.

  A step of ``block`` samples is ``block // lanes`` loads of one sample per thread, all
  issued before their sums (more bytes in flight per thread). Only the first ``live`` rows
  are compared (the rest, ``+inf`` padding, hold no sample and come out 0).
  """
  loads = block // lanes
  per_program = block * steps
  thresholds = [rows_ref[r] for r in range(live)]  # this program's group of rows
  program = pl.program_id(1)  # (read out here: Pallas' interpreter has none inside a cond)

  def sums(bounded):
    step = functools.partial(_step, c_ref, k_ref, first=program * per_program, n=n,
                             block=lanes, unit=unit, bounded=bounded)

    def body(i, acc):
      for c, k, compared in [step(i * loads + j) for j in range(loads)]:
        columns = _lanes_columns(c, k)
        out = []
        for r, threshold in enumerate(thresholds):
          above = jnp.where(compared >= threshold, 1.0, 0.0)
          out.extend(a + above * x for a, x in zip(acc[5 * r:5 * r + 5], columns))
        acc = tuple(out)
      return acc

    zeros = jnp.zeros((lanes,), jnp.float32)
    return lax.fori_loop(0, steps, body, (zeros,) * (5 * live))

  if n % per_program == 0:
    acc = sums(bounded=False)
  else:  # only the last program reads past n
    acc = lax.cond(program < n // per_program, lambda: sums(bounded=False),
                   lambda: sums(bounded=True))
  row = lax.broadcasted_iota(jnp.int32, (num_rows, _WIDTH), 0)
  lane = lax.broadcasted_iota(jnp.int32, (num_rows, _WIDTH), 1)
  out = jnp.zeros((num_rows, _WIDTH), jnp.int32)
  for r in range(live):
    for j, x in _lanes_layout(*(a.astype(jnp.int32) for a in acc[5 * r:5 * r + 5])).items():
      out = jnp.where((row == r) & (lane == j), jnp.sum(x), out)
  out_ref[...] = out


# Programs to aim for: a few per streaming multiprocessor of a large GPU.
_TARGET_PROGRAMS = 1024


def row_sums(confidences: jax.Array, correct: jax.Array, rows: jax.Array, *, unit: bool,
             block: int | None = None, per_program: int | None = None,
             num_warps: int | None = None, num_stages: int | None = None,
             form: str | None = None, live: int | None = None,
             kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> jax.Array:
  """int32 [S, programs, R, 16]: per program, the sums ``G`` of each row over its samples.

  ``confidences`` and ``correct`` are [S, n] (S rows of samples, each summed
  on its own). ``rows`` is float32 [R] (R a power of two >= 16; ``-inf``
  counts every sample, ``+inf`` none). With ``unit`` (the sweep) samples
  whose confidence is NaN or outside [0, 1] are left out; without (the
  calibration bins) every ``c`` is compared as it is.
  ``form``, ``block`` (samples per step), ``num_warps`` and ``num_stages``
  default to ``kernels.launch(R)``'s;
  ``per_program`` samples per program (a power of two <= 2^16; default: at
  most 2^16 and enough programs to fill a large GPU). Rows from ``live`` on
  (default R) must be ``+inf``: "unrolled" leaves them out of its loop.
  ``kernels.interpret`` runs the kernel through Pallas' interpreter.
  """
  from jax.experimental.pallas import triton as plgpu  # noqa: PLC0415 (GPU module, on use)
  num_samples, n = confidences.shape
  num_rows = rows.shape[0]
  launch = kernels.launch(num_rows)
  block = block or launch[1]
  if per_program is None:
    wanted = -(-_TARGET_PROGRAMS // num_samples)
    per_program = min(_PER_PROGRAM, max(block, 1 << max(0, (n // wanted).bit_length() - 1)))
  if not 0 < per_program <= _PER_PROGRAM:
    raise ValueError(f"per_program must be in (0, 2^16] (exact float32 sums), got {per_program}")
  block = min(block, per_program)
  steps = per_program // block
  num_programs = pl.cdiv(n, per_program)
  form = form or launch[0]
  if form not in FORMS:
    raise ValueError(f"form must be one of {FORMS}, got {form!r}")
  live = num_rows if live is None else live
  # Rows per program: all of them, but for "unrolled" at most LANES_MAX_ROWS: more live rows
  # are shared evenly by more programs over the same samples (which then come from the
  # cache), each given its share of the rows, padded with +inf (laid out below).
  group, share, groups = num_rows, live, 1
  laid = form == "unrolled" and num_rows > LANES_MAX_ROWS
  if laid:
    groups = max(1, -(-live // LANES_MAX_ROWS))
    group, share = LANES_MAX_ROWS, -(-live // groups)
    padded = jnp.concatenate([rows, jnp.full((group,), jnp.inf, rows.dtype)])
    rows = padded[np.asarray([g * share + r if r < share else num_rows
                              for g in range(groups) for r in range(group)])]
  num_warps = num_warps or launch[2]
  if form in _LANES_FORMS:
    # Samples per float32 accumulator: at most 1023 (count and correct count share a column).
    lanes = min(block, 32 * num_warps) if form == "unrolled" else block
    if group > LANES_MAX_ROWS or per_program // lanes > 1023:
      raise ValueError(f"form {form!r} takes at most {LANES_MAX_ROWS} rows and 1023 samples per "
                       f"accumulator, got {num_rows} and {per_program // lanes}")
    if form == "lanes":
      kernel = functools.partial(_lanes_kernel, n=n, block=block, steps=steps, unit=unit)
    else:
      kernel = functools.partial(_rows_kernel, n=n, block=block, steps=steps, unit=unit,
                                 num_rows=group, live=share, lanes=lanes)
  else:
    kernel = functools.partial(_bits_kernel, n=n, block=block, steps=steps, unit=unit)
  sums = pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((num_samples, num_programs, groups * group, _WIDTH),
                                     jnp.int32),
      grid=(num_samples, num_programs, groups),
      in_specs=[pl.BlockSpec((group,), lambda s, p, g: (g,)),
                pl.BlockSpec((None, per_program), lambda s, p, g: (s, p)),
                pl.BlockSpec((None, per_program), lambda s, p, g: (s, p))],
      out_specs=pl.BlockSpec((None, None, group, _WIDTH), lambda s, p, g: (s, p, g, 0)),
      compiler_params=plgpu.CompilerParams(num_warps=num_warps,
                                           num_stages=num_stages or launch[3]),
      interpret=kernels.interpret,
      name="cwsa_dense_row_sums",
  )(rows, confidences.astype(jnp.float32), correct)
  if form == "bits":  # every column holds 128 per sample on top of its digits
    offset = sums[..., :1]
    return jnp.concatenate([offset >> 7, sums[..., 1:] - offset], axis=-1)
  if laid:  # back to one row of sums per row, in order (rows from `live` on: 0)
    sums = jnp.concatenate([sums, jnp.zeros_like(sums[:, :, :1])], axis=2)
    zero = groups * group  # the row appended
    sums = sums[:, :, np.asarray([(j // share) * group + j % share if j < groups * share
                                  else zero for j in range(num_rows)])]
  return sums


def _bucket_table(sums: jax.Array, num_buckets: int) -> tuple[jax.Array, jax.Array]:
  """Exact per-bucket ``(hi, lo)`` [S, T + 1, 6] of :func:`row_sums`' [S, programs, R, 16]."""
  g = sums[:, :, :num_buckets + 1] if sums.shape[2] > num_buckets else jnp.pad(
      sums, ((0, 0), (0, 0), (0, 1), (0, 0)))
  per_bucket = g[:, :, :-1] - g[:, :, 1:]  # [S, P, T + 1, 16], exact and non-negative
  col = lambda j: per_bucket[..., j]  # noqa: E731
  both = [col(0), 64 * col(1) + col(2), 64 * col(3) + col(4)]
  right = [col(5), 64 * col(6) + col(7), 64 * col(8) + col(9)]
  wrong = [a - b for a, b in zip(both, right)]
  table = jnp.stack([jnp.stack(wrong, -1), jnp.stack(right, -1)], axis=-2)  # [S, P, T + 1, 2, 3]
  hi, lo = _exact.split(table)
  hi, lo = _exact.canonical(jnp.sum(hi, axis=1), jnp.sum(lo, axis=1))
  shape = hi.shape[:2] + (-1,)
  return hi.reshape(shape), lo.reshape(shape)


def bucket_sums(confidences: jax.Array, correct: jax.Array, sorted_rows: jax.Array, *,
                unit: bool, kernels: _dispatch.Kernels = _dispatch.DEFAULT,
                **options) -> tuple[jax.Array, jax.Array]:
  """Exact per-bucket ``(hi, lo)`` [..., T + 1, 6] of binary samples [..., n], bucket = #rows <= c.

  The sums of ``_stats.segment_columns`` with segment ``2 bucket + correct``,
  bit for bit, for ``sorted_rows`` [T] ascending (T + 1 <= :data:`MAX_BUCKETS`);
  leading axes are rows of samples, each summed on its own. ``options`` go to
  :func:`row_sums` (its launch), ``kernels`` too.
  """
  lead, n = confidences.shape[:-1], confidences.shape[-1]
  num_buckets = sorted_rows.shape[0] + 1
  size = _num_rows(num_buckets)
  rows = jnp.concatenate([jnp.full((1,), -jnp.inf, jnp.float32), sorted_rows.astype(jnp.float32),
                          jnp.full((size - num_buckets,), jnp.inf, jnp.float32)])
  # Integer sums carry no derivative (callers define it); no tangent reaches the kernel.
  confidences = lax.stop_gradient(confidences)
  sums = row_sums(confidences.reshape(-1, n), correct.reshape(-1, n), rows, unit=unit,
                  live=num_buckets, kernels=kernels, **options)
  hi, lo = _bucket_table(sums, num_buckets)
  return hi.reshape(lead + hi.shape[1:]), lo.reshape(lead + lo.shape[1:])

