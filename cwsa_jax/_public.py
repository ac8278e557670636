"""The common entry of the public functions: the kit's conventions, whatever the caller's settings.

Every public function is wrapped by :func:`entry` (the exact metrics) or
:func:`float_entry` (the smooth ones):

* **64-bit mode.** The exact metrics compute in float32 with exact int32
  counts. With ``jax_enable_x64`` on, JAX would make integer sums and
  ``arange`` int64 and literals float64, which their kernels (scatters, Pallas
  calls, the branches of ``lax.platform_dependent``) reject. So they run with
  64-bit mode off: 64-bit JAX arrays are first rounded to float32 / int32,
  as NumPy float64 inputs always are, and the results are the same float32
  values as without x64. The smooth functions keep the caller's mode and
  follow their inputs' float dtype.
* **Explicit mesh axes.** Calls on arrays sharded over an ``Explicit`` mesh
  axis run with the axes ``Auto`` (:func:`_mesh.on_auto_axes`); results come
  back replicated.

Anything else is ``fn`` itself, recognised by a cheap check.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from cwsa_jax import _mesh


def entry(fn):
  """``fn`` with 64-bit mode off and Explicit mesh axes made Auto (see the module).

  For the exact metrics: their counts are int32 whatever the caller's mode.
  """
  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    if not jax.config.jax_enable_x64:
      return _on_auto_axes_if_explicit(fn, args, kwargs)
    args, kwargs = jax.tree.map(_narrow, (args, kwargs))  # while 64-bit types still exist
    with jax.enable_x64(False):
      return _on_auto_axes_if_explicit(fn, args, kwargs)

  return wrapper


_NARROW = {jnp.dtype(jnp.float64): jnp.float32, jnp.dtype(jnp.int64): jnp.int32,
           jnp.dtype(jnp.uint64): jnp.uint32, jnp.dtype(jnp.complex128): jnp.complex64}


def _narrow(leaf):
  """A 64-bit JAX array (or tracer) as its 32-bit type; anything else as it is."""
  if isinstance(leaf, jax.Array) and leaf.dtype in _NARROW:
    return leaf.astype(_NARROW[leaf.dtype])
  return leaf


def float_entry(fn):
  """``fn`` with Explicit mesh axes made Auto, in the caller's 64-bit mode (see the module).

  For the smooth functions (soft metrics, scores, ``nll``, ``brier_score``,
  the temperature): they follow their inputs' float dtype, so float64
  gradients can be checked.
  """
  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    return _on_auto_axes_if_explicit(fn, args, kwargs)

  return wrapper


def _on_auto_axes_if_explicit(fn, args, kwargs):
  leaves, tree = jax.tree.flatten((args, kwargs))
  mesh = _mesh.explicit_mesh(leaves)
  return fn(*args, **kwargs) if mesh is None else _mesh.on_auto_axes(fn, mesh, leaves, tree)


def in_caller_mode(fn):
  """``fn`` run, on whatever thread, in the 64-bit mode of the thread that called this
  (JAX's settings are per thread)."""
  x64 = jax.config.jax_enable_x64

  def run(*args):
    with jax.enable_x64(x64):
      return fn(*args)

  return run
