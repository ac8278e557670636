"""The manual mesh axes of arrays inside ``jax.shard_map``.

Inside a ``shard_map`` every value records the mesh axes it varies over
(per-shard samples vary over the data axis; constants do not), and control
flow (``lax.switch``, ``lax.scan``, ``lax.platform_dependent``) demands equal
axes on all branches and carries. Host callbacks and fresh constants drop
them, so the kernels mark their outputs again with :func:`vary_like`.
"""

from __future__ import annotations

import jax
from jax import lax


def manual_axes(x: jax.Array) -> tuple[str, frozenset]:
  """The name of the aval field holding ``x``'s manual mesh axes, and the axes it varies over."""
  aval = jax.typeof(x)
  mat = getattr(aval, "manual_axis_type", None)  # the field's name differs between jax versions
  if mat is not None:
    return "manual_axis_type", frozenset(getattr(mat, "varying", ()))
  return "vma", frozenset(getattr(aval, "vma", ()))


def vary_like(x, *likes):
  """``x`` (an array or a pytree of arrays) varying over every manual mesh axis of ``likes``.

  Outside a ``shard_map``, and where ``x`` already varies over those axes,
  ``x`` itself.
  """
  axes = frozenset().union(*(manual_axes(like)[1] for like in jax.tree.leaves(likes)))

  def one(leaf):
    missing = tuple(sorted(axes - manual_axes(leaf)[1]))
    return lax.pcast(leaf, missing, to="varying") if missing else leaf

  return jax.tree.map(one, x) if axes else x
