"""The manual mesh axes of arrays inside ``jax.shard_map``.

Inside a ``shard_map`` every value records the mesh axes it varies over
(per-shard samples vary over the data axis; constants do not), and control
flow (``lax.switch``, ``lax.scan``, ``lax.platform_dependent``) demands equal
axes on all branches and carries. Host callbacks and fresh constants drop
them, so the kernels mark their outputs again with :func:`vary_like`.

Outside ``shard_map``, calls on arrays sharded over ``Explicit`` mesh axes
run through :func:`on_auto_axes` (see ``_public.entry``).
"""

from __future__ import annotations

import contextlib

import jax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def manual_axes(x: jax.Array) -> frozenset:
  """The manual mesh axes ``x`` varies over (empty outside ``shard_map``)."""
  aval = jax.typeof(x)
  mat = getattr(aval, "manual_axis_type", None)  # the field's name differs between jax versions
  if mat is not None:
    return frozenset(getattr(mat, "varying", ()))
  return frozenset(getattr(aval, "vma", ()))


def vary_like(x, *likes):
  """``x`` (an array or a pytree of arrays) varying over every manual mesh axis of ``likes``.

  Outside a ``shard_map``, and where ``x`` already varies over those axes,
  ``x`` itself.
  """
  axes = frozenset().union(*(manual_axes(like) for like in jax.tree.leaves(likes)))

  def one(leaf):
    missing = tuple(sorted(axes - manual_axes(leaf)))
    return lax.pcast(leaf, missing, to="varying") if missing else leaf

  return jax.tree.map(one, x) if axes else x


def explicit_mesh(leaves):
  """The mesh of an array in ``leaves`` typed with an ``Explicit`` mesh axis, else None.

  A concrete array's (concrete) mesh where there is one; else a tracer's abstract mesh.
  """
  explicit = getattr(getattr(jax.sharding, "AxisType", None), "Explicit", None)
  found = None
  for leaf in leaves:
    if isinstance(leaf, jax.core.Tracer):
      mesh = getattr(getattr(leaf.aval, "sharding", None), "mesh", None)
    elif isinstance(leaf, jax.Array) and isinstance(leaf.sharding, NamedSharding):
      mesh = leaf.sharding.mesh  # (single-device arrays stop at the isinstance)
    else:
      continue
    if explicit is not None and explicit in getattr(mesh, "axis_types", ()):
      if not isinstance(mesh, jax.sharding.AbstractMesh):
        return mesh
      found = mesh
  return found


def on_auto_axes(fn, mesh, leaves, tree):
  """``fn(*args, **kwargs)`` (flattened: ``leaves``, ``tree``) with ``mesh``'s Explicit axes Auto.

  Arrays sharded over an ``Explicit`` mesh axis (``jax.make_mesh``'s default)
  carry their sharding in their type, and every operation must then say how
  its output is sharded; the kit's kernels (sorts, host callbacks, Pallas
  calls, scatters) leave that to XLA. :func:`jax.sharding.auto_axes` makes
  the axes ``Auto`` for the call: XLA partitions it as for ``Auto`` axes, and
  the results come back replicated over the mesh.
  """
  is_array = [isinstance(leaf, jax.Array) for leaf in leaves]

  def run(*arrays):
    it = iter(arrays)
    args, kwargs = jax.tree.unflatten(tree, [next(it) if x else leaf
                                             for leaf, x in zip(leaves, is_array)])
    return fn(*args, **kwargs)

  arrays = [leaf for leaf, x in zip(leaves, is_array) if x]
  if not isinstance(mesh, jax.sharding.AbstractMesh):  # concrete arrays
    return jax.sharding.auto_axes(run, out_sharding=NamedSharding(mesh, P()))(*arrays)
  # Traced (inside a user's jit), under the arrays' mesh if no mesh is set.
  with contextlib.nullcontext() if mesh == jax.sharding.get_abstract_mesh() else \
      jax.sharding.use_abstract_mesh(mesh):
    return jax.sharding.auto_axes(run, out_sharding=P())(*arrays)
