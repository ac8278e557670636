"""Where a training step runs: the CPU device count, host memory, the data-parallel mesh.

The training loop (:mod:`cwsa_jax.training.train`) runs its step on a one-axis
mesh of local devices (:func:`data_mesh`): the model, optimizer and metric
state and the training split are replicated on each device (:func:`replicated`),
each device gathers and processes its share of the batch (:func:`batch_sharded`),
and XLA's SPMD partitioner sums the gradients, the loss and the batch-norm
statistics over the devices, so a step is that of the whole batch, as on one
device (up to the order of float sums).

XLA:CPU runs one device's convolutions on about one core, so ``cwsa-jax train``
asks for one CPU device per core (:func:`request_cpu_devices`) and lets XLA
reuse the host memory of a step's temporaries (:func:`reuse_host_memory`).
Both must run before JAX creates its backends, which is why they live apart
from the loop and import nothing of it.
"""

from __future__ import annotations

import ctypes
import os
import sys

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


# --------------------------------------------------------------------------- host memory


def reuse_host_memory() -> bool:
  """Lets XLA:CPU reuse the host memory of each step's temporaries (glibc only).

  XLA:CPU allocates a step's temporaries as one block from its worker threads.
  glibc serves a block that large from a fresh ``mmap`` (a thread's arena
  cannot hold it) and unmaps it when the step frees it, so every step faults
  the same memory in again, page by page, in the kernel: the system time
  and minor page faults of a CPU training run. With one malloc arena, no
  ``mmap`` and no trimming (``mallopt``), the freed block stays in the heap
  and the next step reuses it. The arithmetic is unchanged.

  Call it before JAX creates its CPU client (the first array or
  ``jax.devices()``): threads that have allocated already keep their own
  arenas. Starting Python with ``MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0
  MALLOC_TRIM_THRESHOLD_=2147483647`` does the same. Memory the process has
  freed stays mapped until it exits.

  Returns:
    Whether the settings applied: False without glibc, and False (nothing
    changed) once JAX has created its backends, when they would only keep the
    main thread's freed memory mapped.
  """
  if sys.platform != "linux" or _backends_are_initialized():
    return False
  try:
    mallopt = ctypes.CDLL(None).mallopt  # the C library the interpreter runs on
  except (OSError, AttributeError):
    return False
  m_trim_threshold, m_mmap_max, m_arena_max = -1, -4, -8  # glibc's <malloc.h>
  return all(mallopt(param, value) == 1 for param, value in
             ((m_arena_max, 1), (m_mmap_max, 0), (m_trim_threshold, 2**31 - 1)))


def _backends_are_initialized() -> bool:
  try:
    from jax._src import xla_bridge  # noqa: PLC0415 (private; absent: assume not yet)
    return bool(xla_bridge.backends_are_initialized())
  except (ImportError, AttributeError):
    return False


# --------------------------------------------------------------------------- devices


def available_cores() -> int:
  """The CPU cores this process may run on (its affinity mask where the OS has one)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def default_device_count(available: int, batch_size: int) -> int:
  """The most devices, at most ``available``, among which a batch of ``batch_size`` splits evenly.

  Examples:
    >>> default_device_count(2, 128), default_device_count(4, 6), default_device_count(2, 7)
    (2, 3, 1)
  """
  return max(n for n in range(1, max(available, 1) + 1) if batch_size % n == 0)


def check_device_count(devices: int, batch_size: int) -> None:
  """Raises ``ValueError`` unless ``devices`` >= 1 splits the batch evenly."""
  if not isinstance(devices, (int, np.integer)) or isinstance(devices, bool) or devices < 1:
    raise ValueError(f"the device count must be an integer >= 1, got {devices!r}")
  if batch_size % devices:
    raise ValueError(f"the batch size {batch_size} does not split evenly over {devices} devices: "
                     "choose a batch size divisible by the device count")


def request_cpu_devices(devices: int | None, batch_size: int) -> int | None:
  """Asks JAX for several CPU devices, so that a data-parallel step uses several cores.

  XLA:CPU runs the convolutions of one device's step on about one core; the
  batch split over CPU devices (:func:`data_mesh`) runs its parts at once,
  one per core. The count is ``devices``, or by default the most CPU devices,
  up to the cores of this process (:func:`available_cores`), that split the
  batch evenly (:func:`default_device_count`). It applies to the CPU backend
  only: an accelerator's devices are what they are.

  Call it before JAX creates its backends (the first array or
  ``jax.devices()``). Nothing changes when they exist, or when the CPU device
  count is set already (``jax_num_cpu_devices``, ``JAX_NUM_CPU_DEVICES`` or
  ``XLA_FLAGS=--xla_force_host_platform_device_count``).

  Returns:
    The CPU device count set, or None when it was left alone.
  """
  flags = os.environ.get("XLA_FLAGS", "")
  configured = getattr(jax.config, "jax_num_cpu_devices", None)  # JAX < 0.4.34: the XLA flag only
  if (_backends_are_initialized() or (configured is not None and configured >= 0)
      or "xla_force_host_platform_device_count" in flags):
    return None
  count = int(devices if devices is not None else default_device_count(available_cores(), batch_size))
  if configured is None:
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()
  else:
    jax.config.update("jax_num_cpu_devices", count)
  return count


def data_mesh(devices: int | None, batch_size: int) -> Mesh:
  """A one-axis mesh ``("data",)`` over the first ``devices`` local devices.

  A training step on it is data parallel: each device takes
  ``batch_size / devices`` examples of the batch, and XLA's SPMD partitioner
  sums the gradients, the loss and the batch-norm statistics over the
  devices, so the step computes what it computes on one device (up to the
  order of float sums). By default: the most local devices that split the
  batch evenly.

  Raises:
    ValueError: ``devices`` < 1, more than the local devices, or a batch size
      it does not divide.
  """
  available = jax.local_devices()
  if devices is None:
    devices = default_device_count(len(available), batch_size)
  check_device_count(devices, batch_size)
  if devices > len(available):
    raise ValueError(f"{devices} devices asked for, but JAX has {len(available)} "
                     f"({available[0].platform})")
  return Mesh(np.array(available[:devices]), ("data",))


def replicated(mesh: Mesh) -> NamedSharding:
  """Every device of ``mesh`` holds the whole array (model, optimizer, dataset)."""
  return NamedSharding(mesh, P())


def batch_sharded(mesh: Mesh) -> NamedSharding:
  """The leading (batch) axis split over the ``data`` axis of ``mesh``."""
  return NamedSharding(mesh, P("data"))
