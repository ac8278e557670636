"""AURC, AUGRC and E-AURC of resamples given as multiplicities over the samples sorted once:
one pass carrying the running count, errors and last point (``_AreaCarry``), a sequential loop
on CPU and prefix sums on accelerators. The formula pieces are in :mod:`cwsa_jax._areas`."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax.numpy as jnp
from jax import lax

from cwsa_jax import _areas
from cwsa_jax._kernels import _dispatch

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


def _area_carry_zero(shape=()) -> _AreaCarry:
  i0, f0 = jnp.zeros(shape, jnp.int32), jnp.zeros(shape, jnp.float32)
  return _AreaCarry(i0, i0, i0, i0, f0, f0, f0)


def _area_scan(m, correct, group_end, carry: _AreaCarry, convention: str,
               kernels: _dispatch.Kernels = _dispatch.DEFAULT) -> _AreaCarry:
  """The area scan over multiplicities ``m`` [n] (sorted order), from ``carry``, as
  ``kernels`` picks: a sequential loop on CPU (:func:`_area_loop`), prefix sums on
  accelerators (:func:`_area_prefix`), where a loop of n steps runs one step per kernel launch."""
  return kernels.pick("area_scan", m, correct, group_end, carry,
                      cpu=functools.partial(_area_loop, convention=convention),
                      default=functools.partial(_area_prefix, convention=convention))


def _area_prefix(m, correct, group_end, carry: _AreaCarry, convention: str) -> _AreaCarry:
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
      here, e_last.astype(jnp.float32) / jnp.maximum(k_last, 1).astype(jnp.float32),
      carry.r_last)
  point, a, g, _ = _point_terms(group_end, k, e, k_last, e_last, r_last, step_rule)
  zero = jnp.float32(0.0)
  # K and E never decrease: the last point holds the largest of both.
  any_point = jnp.any(point)
  k_point = jnp.maximum(carry.k_last, jnp.max(jnp.where(point, k, 0)))
  e_point = jnp.maximum(carry.e_last, jnp.max(jnp.where(point, e, 0)))
  r_point = carry.r_last if step_rule else jnp.where(
      any_point, e_point.astype(jnp.float32) / jnp.maximum(k_point, 1).astype(jnp.float32),
      carry.r_last)
  return _AreaCarry(k[-1], e[-1], k_point, e_point, r_point,
                    carry.area + jnp.sum(jnp.where(point, a, zero)),
                    carry.generalized + jnp.sum(jnp.where(point, g, zero)))


def _point_terms(end, k, e, k_last, e_last, r_last, step_rule: bool):
  """(point, n AURC term, n^2 AUGRC term, risk) at samples with K, E and the last point K', E'.

  A group end with K > K' is a point (K/n, E/K); it adds W E/K (step) or
  W (E/K + r')/2 (trapezoid, r' the last point's risk E'/K', or E/K for the
  first point) to n AURC and W E or W (E + E')/2 to n^2 AUGRC, W = K - K'
  (:func:`cwsa_jax._areas.point_terms`).
  """
  point = end & (k > k_last)
  width = (k - k_last).astype(jnp.float32)
  kf, ef = k.astype(jnp.float32), e.astype(jnp.float32)
  risk = ef / jnp.where(point, kf, 1.0)
  if step_rule:
    return (point, *_areas.point_terms(width, risk, ef, "step"), risk)
  previous = (k_last > 0, r_last, e_last.astype(jnp.float32))
  return (point, *_areas.point_terms(width, risk, ef, "trapezoid", previous), risk)


def _area_loop(m, correct, group_end, carry: _AreaCarry, convention: str) -> _AreaCarry:
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
    point, a, g, risk = _point_terms(end, k, e, k_last, e_last, r_last, step_rule)
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


def _areas_from_carry(carry: _AreaCarry, convention: str):
  """AURC, AUGRC and E-AURC of the area scan's final ``carry``."""
  step_rule = convention == "step"
  total, num_errors, area, generalized = carry.k, carry.e, carry.area, carry.generalized
  n = total.astype(jnp.float32)  # the resample's size: sum of m
  aurc, augrc = _areas.areas(area, generalized, n)
  num_right = total - num_errors
  if step_rule:
    # sum_{k = r + 1}^{n} (k - r)/k / n with r correct: (E - r (H_n - H_r)) / n.
    oracle = _areas.step_oracle(num_errors.astype(jnp.float32), num_right.astype(jnp.float32),
                                _areas.harmonic_difference(num_right, total), n)
  else:
    oracle = _areas.trapezoid_oracle(num_errors.astype(jnp.float32), n)
  eaurc = _areas.eaurc(aurc, oracle, _areas.one_class(num_errors, total))
  return {"aurc": aurc, "augrc": augrc, "eaurc": eaurc}
