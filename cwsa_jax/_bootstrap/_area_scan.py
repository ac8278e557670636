"""AURC, AUGRC and E-AURC of resamples given as multiplicities over the samples sorted once:
one pass carrying the running count, errors and last point (``_AreaCarry``), a sequential loop
on CPU and prefix sums on accelerators. The formula pieces are in :mod:`cwsa_jax._areas`.

The in-memory bootstrap knows a resample's multiplicities, hence its number of correct samples,
before any area term: its E-AURC is summed from the exact integer differences to the oracle
(:func:`_excess_sum`, as the exact metrics do), never as AURC less the oracle, which cancel
for a nearly optimal ranking.

The streamed bootstrap continues one resample's scan over many ranges of samples, up to 2^53
in all: its carry (``_WideAreaCarry``) holds K and E as ``_exact``'s wide sums, and each range
is scanned with int32 counts relative to a frame below them (``_Frame``); the in-memory
bootstrap (fewer than 2^29 samples) keeps the int32 carry and the plain loop."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax.numpy as jnp
from jax import lax

import numpy as np

from cwsa_jax import _areas
from cwsa_jax import _exact
from cwsa_jax import _stats
from cwsa_jax._kernels import _dispatch
from cwsa_jax._kernels import _sort

_SCAN_BLOCK = 1024  # samples per block of the CPU loop's float32 sums


class _AreaCarry(NamedTuple):
  """The state of the area scan after some samples (int32 counts, float32 sums)."""
  k: Any        # multiplicities so far (the resample's size at the end)
  e: Any        # errors so far
  k_last: Any   # K and E of the last point (group end with K > K')
  e_last: Any
  r_last: Any   # its risk E'/K' (trapezoid)
  area: Any     # n AURC so far
  generalized: Any  # n^2 AUGRC so far


class _Frame(NamedTuple):
  """Where a range's int32 counts start: the true K and E are ``F_K + k`` and ``F_E + e``.

  ``k``, ``e``: float32 F_K, F_E (multiples of 2^30, exact); ``some``: F_K > 0 (the
  scan has passed a point before the range). The in-memory scan has no frame (None).
  """
  k: Any
  e: Any
  some: Any


def _global(local, base):
  """float32 of the count ``base + local`` (int32 ``local``; ``base`` a float32 multiple of
  2^30 or 0, where it is the plain conversion: ``0.0 + x`` is exactly ``x``)."""
  return base + local.astype(jnp.float32)


def _area_carry_zero(shape=()) -> _AreaCarry:
  i0, f0 = jnp.zeros(shape, jnp.int32), jnp.zeros(shape, jnp.float32)
  return _AreaCarry(i0, i0, i0, i0, f0, f0, f0)


def _area_scan(m, correct, group_end, carry: _AreaCarry, convention: str,
               kernels: _dispatch.Kernels = _dispatch.DEFAULT,
               frame: _Frame | None = None) -> _AreaCarry:
  """The area scan over multiplicities ``m`` [n] (sorted order), from ``carry``, as
  ``kernels`` picks: a sequential loop on CPU (:func:`_area_loop`), prefix sums on
  accelerators (:func:`_area_prefix`), where a loop of n steps runs one step per kernel launch.
  ``frame``: the carry's counts are relative to it (:class:`_Frame`)."""
  if frame is None:
    return kernels.pick("area_scan", m, correct, group_end, carry,
                        cpu=functools.partial(_area_loop, convention=convention),
                        default=functools.partial(_area_prefix, convention=convention))
  return kernels.pick(
      "area_scan", m, correct, group_end, carry, frame,
      cpu=lambda *a: _area_loop(*a[:4], convention=convention, frame=a[4]),
      default=lambda *a: _area_prefix(*a[:4], convention=convention, frame=a[4]))


def _area_prefix(m, correct, group_end, carry: _AreaCarry, convention: str,
                 frame: _Frame | None = None) -> _AreaCarry:
  """:func:`_area_loop`'s carry by prefix sums: the same integers, the areas to float32 rounding.

  K and E are prefix sums of m and m (1 - correct). Across group ends with no
  multiplicity neither changes, so the last point before a group end p is the
  previous group end p' (or the carry's, when none is in these samples):
  ``K' = K_{p'}``, ``E' = E_{p'}``; p is a point when ``K_p > K'``.
  """
  step_rule = convention == "step"
  mi = m.astype(jnp.int32)
  k = carry.k + jnp.cumsum(mi)
  e = carry.e + jnp.cumsum(jnp.where(correct, 0, mi))
  position = lax.iota(jnp.int32, m.shape[0])
  # The previous group end of every sample (-1: none here), independent of m.
  latest = lax.cummax(jnp.where(group_end, position, -1))
  previous = jnp.concatenate([jnp.full((1,), -1, jnp.int32), latest[:-1]])
  here = previous >= 0
  at = jnp.maximum(previous, 0)
  k_last = jnp.where(here, k[at], carry.k_last)
  e_last = jnp.where(here, e[at], carry.e_last)
  r_last = carry.r_last if step_rule else jnp.where(
      here, _last_risk(k_last, e_last, frame), carry.r_last)
  point, a, g, _ = _point_terms(group_end, k, e, k_last, e_last, r_last, step_rule, frame)
  zero = jnp.float32(0.0)
  # K and E never decrease: the last point holds the largest of both.
  any_point = jnp.any(point)
  k_point = jnp.maximum(carry.k_last, jnp.max(jnp.where(point, k, 0)))
  e_point = jnp.maximum(carry.e_last, jnp.max(jnp.where(point, e, 0)))
  r_point = carry.r_last if step_rule else jnp.where(
      any_point, _last_risk(k_point, e_point, frame), carry.r_last)
  return _AreaCarry(k[-1], e[-1], k_point, e_point, r_point,
                    carry.area + jnp.sum(jnp.where(point, a, zero)),
                    carry.generalized + jnp.sum(jnp.where(point, g, zero)))


def _last_risk(k_last, e_last, frame: _Frame | None):
  """The last point's risk E'/K' (float32; 0 before any point)."""
  if frame is None:
    return e_last.astype(jnp.float32) / jnp.maximum(k_last, 1).astype(jnp.float32)
  return _global(e_last, frame.e) / _global(
      jnp.where(frame.some, k_last, jnp.maximum(k_last, 1)), frame.k)


def _point_terms(end, k, e, k_last, e_last, r_last, step_rule: bool,
                 frame: _Frame | None = None):
  """(point, n AURC term, n^2 AUGRC term, risk) at samples with K, E and the last point K', E'.

  A group end with K > K' is a point (K/n, E/K); it adds W E/K (step) or
  W (E/K + r')/2 (trapezoid, r' the last point's risk E'/K', or E/K for the
  first point) to n AURC and W E or W (E + E')/2 to n^2 AUGRC, W = K - K'
  (:func:`cwsa_jax._areas.point_terms`). With a ``frame`` the counts are relative to
  it: W is their difference, E and K in the risk the frame's float plus theirs.
  """
  point = end & (k > k_last)
  width = (k - k_last).astype(jnp.float32)
  if frame is None:
    kf, ef = k.astype(jnp.float32), e.astype(jnp.float32)
    has_previous, e_last_f = k_last > 0, e_last.astype(jnp.float32)
  else:
    kf, ef = _global(k, frame.k), _global(e, frame.e)
    has_previous, e_last_f = frame.some | (k_last > 0), _global(e_last, frame.e)
  risk = ef / jnp.where(point, kf, 1.0)
  if step_rule:
    return (point, *_areas.point_terms(width, risk, ef, "step"), risk)
  previous = (has_previous, r_last, e_last_f)
  return (point, *_areas.point_terms(width, risk, ef, "trapezoid", previous), risk)


def _area_loop(m, correct, group_end, carry: _AreaCarry, convention: str,
               frame: _Frame | None = None) -> _AreaCarry:
  """The area scan over multiplicities ``m`` [n] (sorted order), from ``carry``, sequentially.

  Carries K and E (count and errors so far) and the last point (K', E');
  every point adds :func:`_point_terms`. float32 sums per block of samples,
  then over the blocks.
  """
  size = min(_SCAN_BLOCK, m.shape[0])
  pad = -m.shape[0] % size
  # m as given (Poisson: int8) and the errors formed in the loop: the scan reads as few
  # bytes per sample as it can (it runs out of the cache at a few million samples).
  xs = [jnp.pad(x, (0, pad)).reshape(-1, size) for x in (m, correct, group_end)]
  step_rule = convention == "step"
  # XLA:CPU compiles the trapezoid's loop body badly when unrolled 8 times (tens of times slower).
  unroll = 8 if step_rule else 2

  def sample(carry, x):
    k, e, k_last, e_last, r_last, area, generalized = carry
    mi, right, end = x
    mi = mi.astype(jnp.int32)
    k, e = k + mi, e + jnp.where(right, 0, mi)
    point, a, g, risk = _point_terms(end, k, e, k_last, e_last, r_last, step_rule, frame)
    area = area + jnp.where(point, a, 0.0)
    generalized = generalized + jnp.where(point, g, 0.0)
    k_last, e_last = jnp.where(point, k, k_last), jnp.where(point, e, e_last)
    r_last = r_last if step_rule else jnp.where(point, risk, r_last)
    return (k, e, k_last, e_last, r_last, area, generalized), None

  def block(carry, x):
    k, e, k_last, e_last, r_last, area, generalized = carry
    zero = jnp.zeros((), jnp.float32)
    (k, e, k_last, e_last, r_last, a, g), _ = lax.scan(
        sample, (k, e, k_last, e_last, r_last, zero, zero), x, unroll=unroll)
    return (k, e, k_last, e_last, r_last, area + a, generalized + g), None

  out, _ = lax.scan(block, tuple(carry), xs)
  return _AreaCarry(*out)


def _areas_from_carry(carry: _AreaCarry, convention: str, excess=None):
  """AURC, AUGRC and E-AURC of the area scan's final ``carry``.

  E-AURC: ``excess / n`` from :func:`_excess_sum` of the same multiplicities (the division
  rounded once; 0 with one class), or without ``excess`` AURC less the oracle's closed form,
  which loses the relative precision of a small E-AURC (a stream's correct count is known
  only at its end).
  """
  step_rule = convention == "step"
  total, num_errors, area, generalized = carry.k, carry.e, carry.area, carry.generalized
  n = total.astype(jnp.float32)  # the resample's size: sum of m
  aurc, augrc = _areas.areas(area, generalized, n)
  if excess is not None:
    eaurc = jnp.where(_areas.one_class(num_errors, total), jnp.float32(0.0),
                      _stats.divide((excess, n))[0])
    return {"aurc": aurc, "augrc": augrc, "eaurc": eaurc}
  num_right = total - num_errors
  if step_rule:
    # sum_{k = r + 1}^{n} (k - r)/k / n with r correct: (E - r (H_n - H_r)) / n.
    oracle = _areas.step_oracle(num_errors.astype(jnp.float32), num_right.astype(jnp.float32),
                                _areas.harmonic_difference(num_right, total), n)
  else:
    oracle = _areas.trapezoid_oracle(num_errors.astype(jnp.float32), n)
  eaurc = _areas.eaurc(aurc, oracle, _areas.one_class(num_errors, total))
  return {"aurc": aurc, "augrc": augrc, "eaurc": eaurc}


# --- E-AURC of an in-memory resample from exact differences ---------------------------------
#
# With K, E the prefix sums of m and m (1 - correct) (exact int32) and m_c the resample's
# correct count, n E-AURC is :mod:`cwsa_jax._areas`' sum of nonnegative terms: each point's
# ``W (E_K - E*_K) / K`` ("step") or trapezoid excess, and for "step" the oracle's tie term of
# every position that is not the last of its tie group. A sample of multiplicity m_i holds the
# positions K_before + 1 .. K_before + m_i, each a term of its own; the terms are summed in
# blocks (float32, each term and sum rounded: a relative error of a few 1e-7).

# Positions of one sample summed term by term: every Poisson multiplicity (at most 12) and all
# but a vanishing fraction of multinomial ones; the positions past these take a closed form.
_TIE_TERMS = 12
_SUM_BLOCK = 1024


def _tie_groups(group_end):
  """int32 [n] ``(first, last)``: the index of the first and of the last sample of each
  sample's tie group (found once per data set, outside the loop over resamples)."""
  n = group_end.shape[0]
  position = lax.iota(jnp.int32, n)
  start = jnp.concatenate([jnp.ones((1,), bool), group_end[:-1]])
  first = lax.cummax(jnp.where(start, position, 0))
  last = lax.cummin(jnp.where(group_end, position, n - 1), reverse=True)
  return first, last


def _tie_terms(mi, k_before, count, k_last, num_correct):
  """The "step" oracle's tie terms (float32 [n], >= 0) of each sample's first ``count``
  positions ``q = K_before + 1, ...`` (none the last of its group), rank ``q - K'``
  (:func:`cwsa_jax._areas.tie_excess`): term by term for the first :data:`_TIE_TERMS`, the rest
  ``[a, b]`` (a multiplicity past them) in closed form,

  .. math::

    m_c \\sum_{q = a}^{b} \\frac{q - K'}{q (q + 1)}
      = m_c \\Bigl(H_{b + 1} - H_a - \\frac{K' (b + 1 - a)}{a (b + 1)}\\Bigr),
    \\qquad a \\ge m_c,

  whose two parts round against each other (a relative error up to ``a / (a - K')`` ulps of
  that rare term).
  """
  zero = jnp.float32(0.0)
  terms = jnp.zeros(mi.shape, jnp.float32)
  for j in range(_TIE_TERMS):
    q = k_before + (j + 1)
    terms = terms + jnp.where(j < count, _areas.tie_excess(q - k_last, q, num_correct), zero)
  a = jnp.maximum(k_before + (_TIE_TERMS + 1), num_correct)
  b = k_before + count
  af, b1 = a.astype(jnp.float32), (b + 1).astype(jnp.float32)
  rest = jnp.asarray(num_correct).astype(jnp.float32) * (
      _areas.harmonic_difference(jnp.minimum(a, b + 1), b + 1)
      - k_last.astype(jnp.float32) * ((b1 - af) / (af * b1)))
  return terms + jnp.where(b >= a, jnp.maximum(rest, zero), zero)


def _blocked_sum(x):
  """float32 sum of ``x`` [n], in blocks and then over the blocks (a short chain of roundings
  for each partial sum)."""
  size = min(_SUM_BLOCK, x.shape[0])
  return jnp.sum(jnp.sum(jnp.pad(x, (0, -x.shape[0] % size)).reshape(-1, size), axis=1))


def _excess_sum(m, correct, group_end, groups, convention: str,
                kernels: _dispatch.Kernels = _dispatch.DEFAULT):
  """n E-AURC (float32, >= 0) of the resample with multiplicities ``m`` [n] over the samples
  sorted once, from the exact integer differences ``E_K - E*_K`` to its oracle: nothing
  cancels, and an optimal order gives exactly 0 (:mod:`cwsa_jax._areas`' terms).

  ``groups``: :func:`_tie_groups` of ``group_end``. The previous point of a sample's group is
  the count before the group's first sample (groups without multiplicity add nothing), and a
  sample holds its group's last position when its K is the group end's and ``m_i > 0``.
  """
  first, last = groups
  mi = m.astype(jnp.int32)
  wrong = jnp.where(correct, 0, mi)
  k = _sort.cumsum(mi, kernels=kernels)
  e = _sort.cumsum(wrong, kernels=kernels)
  k_before, e_before = k - mi, e - wrong
  k_last, e_last = k_before[first], e_before[first]  # K', E' of the previous point
  total, num_errors = k[-1], e[-1]
  num_correct = total - num_errors
  point = group_end & (k > k_last)
  width, end = k - k_last, jnp.maximum(k, 1)
  zero = jnp.float32(0.0)
  if convention == "trapezoid":
    terms = jnp.where(point, _areas.trapezoid_excess(width, end, e, (k_last > 0, k_last, e_last),
                                                     num_correct, total), zero)
  else:
    holds_last = (mi > 0) & (k == k[last])
    count = mi - holds_last.astype(jnp.int32)
    terms = (jnp.where(point, _areas.step_excess(width, end, e, num_correct), zero)
             + _tie_terms(mi, k_before, count, k_last, num_correct))
  return _blocked_sum(terms)


# --- the streamed bootstrap's carry: exact counts past int32 --------------------------------
#
# A resample of up to 2^53 rows (and a Poisson resample's size beyond) needs K and E past
# int32. The loop keeps its int32 counts: each range is scanned relative to a frame F (a
# multiple of 2^30, or 0) with the counts K - F, E - F_E below 2^31, and the range's own
# increments are added to the wide counts afterwards. A range always ends at a group end, so
# the last point is the carry's K and E (K' = K, E' = E) and only K, E are carried.

_FRAME_BITS = 30
# The most a range may add to a resample's K (checked with the range's exact bucket sums): the
# relative counts then start below 2^30 and stay below 2^31.
RANGE_TOTAL_LIMIT = 1 << _FRAME_BITS


class _WideAreaCarry(NamedTuple):
  """The area scan's state between ranges: K and E as ``_exact`` wide sums (top, hi, lo),
  exact to 2^53 and beyond; the float32 risk of the last point and the area sums as in
  :class:`_AreaCarry`."""
  k: Any
  e: Any
  r_last: Any
  area: Any
  generalized: Any


def _wide_area_carry_zero(shape=()) -> _WideAreaCarry:
  zeros = lambda: tuple(jnp.zeros(shape, jnp.int32) for _ in range(3))  # noqa: E731
  f0 = jnp.zeros(shape, jnp.float32)
  return _WideAreaCarry(zeros(), zeros(), f0, f0, f0)


def _small(w, limit_bits: int):
  """Whether the wide count ``w`` is below 2^limit_bits (limit_bits in [12, 36])."""
  top, hi, _ = w
  return (top == 0) & (hi < 1 << (limit_bits - _exact.CARRY_BITS))


def _relative(w, in_int32):
  """(int32 count, float32 frame) of the wide count ``w``: ``w`` itself and 0 where
  ``in_int32``, else ``w mod 2^30`` and ``w - w mod 2^30``."""
  top, hi, lo = w
  low_bits = _FRAME_BITS - _exact.CARRY_BITS
  relative = jnp.where(in_int32, (hi << _exact.CARRY_BITS) | lo,
                       ((hi & ((1 << low_bits) - 1)) << _exact.CARRY_BITS) | lo)
  # top 2^36 + (hi >> 18) 2^30 with top < 2^18: both floats and their sum exact.
  frame = (top.astype(jnp.float32) * np.float32(2.0**36)
           + (hi >> low_bits).astype(jnp.float32) * np.float32(2.0**_FRAME_BITS))
  return relative, jnp.where(in_int32, jnp.float32(0.0), frame)


def _wide_area_scan(m, correct, group_end, carry: _WideAreaCarry, total, convention: str,
                    kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> _WideAreaCarry:
  """:func:`_area_scan` of one range from a wide carry; ``total`` (int32) is the range's
  sum of ``m`` (below :data:`RANGE_TOTAL_LIMIT`, else the result is meaningless: the caller
  marks the state).

  Where ``K + total`` stays below 2^31 the counts are relative to 0, so the loop is the
  in-memory one, bit for bit; else to the frame ``K - K mod 2^30``.
  """
  in_int32 = _small(carry.k, 31) & (
      _exact.to_int(carry.k[1], carry.k[2]) <= jnp.int32(2**31 - 1) - total)
  k0, k_frame = _relative(carry.k, in_int32)
  e0, e_frame = _relative(carry.e, in_int32)
  frame = _Frame(k_frame, e_frame, k_frame > 0)
  local = _AreaCarry(k0, e0, k0, e0, carry.r_last, carry.area, carry.generalized)
  out = _area_scan(m, correct, group_end, local, convention, kernels, frame)
  grow = lambda w, added: _exact.wide_add(w, _exact.widen(*_exact.split(added)))  # noqa: E731
  return _WideAreaCarry(grow(carry.k, out.k - k0), grow(carry.e, out.e - e0), out.r_last,
                        out.area, out.generalized)


def _harmonic_difference_float(r_small, r, d, n):
  """H_n - H_r (float32) as :func:`cwsa_jax._areas.harmonic_difference` for n >= 8 given as
  floats: ``r``, ``d = n - r`` and ``n`` (each rounded once), and ``r_small`` the int32 r
  where r < 8 (else any value: ``r >= 8`` is read from ``r``)."""
  def tail(x):  # f(x) - ln x
    return 0.5 / x - 1.0 / (12.0 * x * x) + 1.0 / (120.0 * x * x * x * x)

  small = jnp.asarray(_areas.SMALL_HARMONIC)
  rf = jnp.maximum(r, 8.0)
  large = jnp.log1p(d / rf) + tail(n) - tail(rf)
  h_n = jnp.log(n) + np.float32(np.euler_gamma) + tail(n)
  return jnp.where(r >= 8.0, large, h_n - small[jnp.clip(r_small, 0, 7)])


def _areas_from_wide_carry(carry: _WideAreaCarry, convention: str):
  """:func:`_areas_from_carry` of a wide carry: the exact K, E and K - E rounded once each
  to float32 (the int32 conversions where they fit, so the same floats), the rest as there;
  past int32 the oracle's harmonic difference from those floats."""
  total, num_errors = carry.k, carry.e
  num_right = _exact.wide_sub(total, num_errors)
  n, errors, right = (_exact.wide_to_float(w) for w in (total, num_errors, num_right))
  aurc, augrc = _areas.areas(carry.area, carry.generalized, n)
  if convention == "step":
    as_int = lambda w: _exact.to_int(w[1], w[2])  # noqa: E731 (meaningful below 2^31 only)
    harmonic = jnp.where(
        _small(total, 31), _areas.harmonic_difference(as_int(num_right), as_int(total)),
        _harmonic_difference_float(num_right[2], right, errors, n))
    oracle = _areas.step_oracle(errors, right, harmonic, n)
  else:
    oracle = _areas.trapezoid_oracle(errors, n)
  same = lambda a, b: (a[0] == b[0]) & (a[1] == b[1]) & (a[2] == b[2])  # noqa: E731
  zero = tuple(jnp.zeros_like(x) for x in num_errors)
  eaurc = _areas.eaurc(aurc, oracle, same(num_errors, zero) | same(num_errors, total))
  return {"aurc": aurc, "augrc": augrc, "eaurc": eaurc}
