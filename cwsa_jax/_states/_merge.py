"""Merging a state over the processes of a ``jax.distributed`` job: :func:`process_merge`, its
checks (every process alive, the same kind of state) and the one all-reduce."""

from __future__ import annotations

import functools
import hashlib
from typing import Any, Callable

import jax
import numpy as np

from cwsa_jax._states._calibration_state import CalibrationState
from cwsa_jax._states._common import public
from cwsa_jax._states._risk_coverage_state import RiskCoverageState
from cwsa_jax._states._sweep_state import SweepState

_MERGEABLE = (SweepState, CalibrationState, RiskCoverageState)
_DESCRIPTION_BYTES = 256
_DIGEST_BYTES = 32
_PROCESS_AXIS = "processes"
_OK, _NOT_A_STATE, _ALREADY_GLOBAL = 0, 1, 2


@public
def process_merge(state: Any) -> Any:
  """Merges a state over every process of a ``jax.distributed`` job; each process gets the total.

  Each of the ``P`` processes passes the state of its own share of the data
  (its files, its batches); every process gets back the state of all of them,

  .. math::

    S = S_0 \\oplus S_1 \\oplus \\cdots \\oplus S_{P-1},

  where :math:`\\oplus` is the state's :meth:`~SweepState.merge`: exact integer
  addition of the sums (and min / max of the key ranges of a
  :class:`RiskCoverageState`). So ``process_merge(state).compute()`` equals
  one process's result on all the data *bit for bit*, however the data was
  split. The states are exchanged with one all-reduce of the state's
  :meth:`~SweepState.reduce` over one device per process (XLA's collectives:
  NCCL / ICI on GPU / TPU hosts, gloo over TCP on CPU), so each process sends
  and receives about twice the state's bytes, whatever ``n`` and ``P``.

  Every process must call it (it is a collective), in the same order for
  several states. Before exchanging anything it checks that every process is
  alive and passed a state of the same type and configuration (thresholds,
  correctness type, number of bins, mantissa bits, batch shape), and raises on
  every process otherwise. With one process it returns ``state`` unchanged.

  A process that died before the merge is named in a ``RuntimeError`` on the
  others once JAX's coordination service sees it gone: at once for a clean
  exit, after ``heartbeat_timeout_seconds`` (an argument of
  :func:`jax.distributed.initialize`) for a crash. This needs
  ``jax.config.update("jax_enable_recoverability", True)`` before
  :func:`jax.distributed.initialize`; without it the coordination service
  itself terminates every process when it notices the death (an abort whose
  log names the task that stopped sending heartbeats). A process that dies
  during the exchange makes the others raise ``RuntimeError`` (gloo: at once
  once connected, else within its 30 s rendezvous timeout).

  Args:
    state: this process's :class:`SweepState`, :class:`CalibrationState` or
      :class:`RiskCoverageState` (leading batch axes allowed), built on its
      own devices.

  Returns:
    The merged state, of the same class and shapes, on this process's first
    local device.

  Raises:
    TypeError: some process passed something that is not such a state.
    ValueError: some process passed a state of another type or configuration,
      or one that already spans several processes (merged already).
    RuntimeError: some process died before or during the merge.

  Examples:
    >>> s = SweepState.from_batch(np.array([0.9, 0.6]), np.array([True, False]), [0.5, 0.7])
    >>> process_merge(s) is s  # one process: nothing to merge
    True
  """
  kind, digest, description = _merge_signature(state)
  count = jax.process_count()
  if count == 1:
    if kind != _OK:
      error = TypeError if kind == _NOT_A_STATE else ValueError
      raise error("process_merge needs a SweepState, CalibrationState or RiskCoverageState; "
                  f"got {description}")
    return state
  _check_processes_alive(count)
  _check_same_signature(kind, digest, description, count)
  return _all_reduce_over_processes(state, count)


def _merge_signature(state: Any) -> tuple[int, bytes, str]:
  """(kind, digest, description): processes may merge their states only if the digests are equal."""
  name = type(state).__name__
  if not isinstance(state, _MERGEABLE):
    return _NOT_A_STATE, b"", f"a {name}, not a SweepState, CalibrationState or RiskCoverageState"
  leaves = jax.tree_util.tree_leaves(state)
  if not all(getattr(leaf, "is_fully_addressable", True) for leaf in leaves):
    return _ALREADY_GLOBAL, b"", (f"a {name} whose arrays already span several processes "
                                  "(a global array: the state is merged already)")
  lead = state.invalid.shape
  batch = f", batch shape {lead}" if lead else ""
  if isinstance(state, SweepState):
    t = np.asarray(state.thresholds, np.float32).reshape(-1, state.thresholds.shape[-1])[0]
    t_hash = hashlib.sha256(t.tobytes()).hexdigest()[:8]
    shown = (", ".join(f"{x:.6g}" for x in t) if len(t) <= 6
             else f"{t[0]:.6g} ... {t[-1]:.6g}, sha256 {t_hash}")
    kind_of = "graded" if state.graded else "boolean"
    description = (f"SweepState({len(t)} thresholds [{shown}], {kind_of} correctness, "
                   f"normalize={type(state)._normalize!r}{batch})")
    extra = t.tobytes()
  elif isinstance(state, CalibrationState):
    description = f"CalibrationState(num_bins={state.num_bins}, norm={type(state)._norm!r}{batch})"
    extra = b""
  else:
    description = f"RiskCoverageState(mantissa_bits={state.mantissa_bits}{batch})"
    extra = b""
  shapes = repr([(np.shape(leaf), str(getattr(leaf, "dtype", type(leaf).__name__)))
                 for leaf in leaves])
  digest = hashlib.sha256(description.encode() + shapes.encode() + extra).digest()
  return _OK, digest, description


def _distributed_client():
  """The ``jax.distributed`` client of this process, or None (JAX keeps it private)."""
  try:
    from jax._src import distributed  # pylint: disable=g-import-not-at-top
    return distributed.global_state.client
  except (ImportError, AttributeError):
    return None


def _check_processes_alive(count: int) -> None:
  """Waits for every live process to arrive here; raises naming the processes that are gone."""
  client = _distributed_client()
  if client is None or not hasattr(client, "get_live_nodes"):
    return
  try:
    # A barrier over the live processes that returns the same live set to all of them.
    live = client.get_live_nodes(list(range(count)))
  except Exception as err:  # the coordination service (hosted by process 0) is gone
    raise RuntimeError("process_merge: lost the jax.distributed coordinator (process 0); nothing "
                       f"was merged ({err})") from err
  dead = sorted(set(range(count)) - set(int(p) for p in live))
  if dead:
    names = ", ".join(str(p) for p in dead)
    raise RuntimeError(
        f"process_merge: process{'es' if len(dead) > 1 else ''} {names} of {count} died before the "
        "merge (exited, crashed or stopped sending heartbeats); nothing was merged")


def _check_same_signature(kind: int, digest: bytes, description: str, count: int) -> None:
  """Exchanges the signatures of the states (a few hundred bytes per process) and compares them."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  text = description.encode()[:_DESCRIPTION_BYTES].ljust(_DESCRIPTION_BYTES, b"\0")
  row = np.frombuffer(bytes([kind]) + digest.ljust(_DIGEST_BYTES, b"\0") + text, np.uint8)
  try:
    rows = np.asarray(multihost_utils.process_allgather(row))
  except Exception as err:
    raise _exchange_failed(err) from err
  kinds = rows[:, 0]
  digests = [r[1:1 + _DIGEST_BYTES].tobytes() for r in rows]
  said = [r[1 + _DIGEST_BYTES:].tobytes().rstrip(b"\0").decode(errors="replace") for r in rows]
  for bad_kind, error in ((_NOT_A_STATE, TypeError), (_ALREADY_GLOBAL, ValueError)):
    bad = [p for p in range(count) if kinds[p] == bad_kind]
    if bad:
      raise error(f"process_merge: process {bad[0]} passed {said[bad[0]]}"
                  + (f" (so did processes {bad[1:]})" if len(bad) > 1 else ""))
  odd = [p for p in range(count) if digests[p] != digests[0]]
  if odd:
    raise ValueError(
        f"process_merge: process {odd[0]} passed {said[odd[0]]} but process 0 passed {said[0]}"
        + (f" (processes {odd} differ from process 0)" if len(odd) > 1 else "")
        + "; every process must pass a state of the same type and configuration")


def _exchange_failed(err: Exception) -> RuntimeError:
  return RuntimeError(
      "process_merge: exchanging the states between processes failed, most likely because a "
      f"process died or lost its connection during the merge; nothing was merged ({err})")


@functools.lru_cache(maxsize=None)
def _process_reducer(devices: tuple) -> tuple[jax.sharding.Mesh, Callable]:
  mesh = jax.sharding.Mesh(np.array(devices), (_PROCESS_AXIS,))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return mesh, jax.jit(lambda stacked: stacked.reduce(), out_shardings=replicated)


def _all_reduce_over_processes(state: Any, count: int) -> Any:
  """The state's ``reduce`` over a [P, ...] stack sharded one row per process (an all-reduce)."""
  devices = tuple(jax.local_devices(process_index=p)[0] for p in range(count))
  mesh, reduce = _process_reducer(devices)
  local = devices[jax.process_index()]
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(_PROCESS_AXIS))

  def stack(leaf):
    row = jax.device_put(np.asarray(leaf)[None], local)
    return jax.make_array_from_single_device_arrays((count,) + row.shape[1:], rows, [row])

  stacked = jax.tree.map(stack, state)
  try:
    merged = jax.block_until_ready(reduce(stacked))
  except Exception as err:
    raise _exchange_failed(err) from err
  return jax.tree.map(lambda x: x.addressable_data(0), merged)
