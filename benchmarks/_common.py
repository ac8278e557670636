"""Shared helpers for the benchmark scripts: timing, environment record, JSON output."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from typing import Sequence

import jax
import numpy as np

from cwsa_jax._kernels import _sort


def environment() -> dict:
  """Device, versions and machine facts recorded with every benchmark."""
  dev = jax.devices()[0]
  return {
      "device": f"{dev.platform}:{getattr(dev, 'device_kind', '')}",
      "num_devices": jax.device_count(),
      "cpu_count": os.cpu_count(),
      "python": platform.python_version(),
      "jax": jax.__version__,
      "numpy": np.__version__,
      "machine": platform.machine(),
      "cpu_model": cpu_model(),
      "numpy_simd": numpy_simd(),
  }


def cpu_model() -> str | None:
  """The CPU's model name (and family/model on x86 Linux), or None where /proc/cpuinfo is absent."""
  info = _sort.cpuinfo_fields(_sort.read_cpuinfo())
  if not info:
    return platform.processor() or None
  parts = [info.get("model name"), info.get("vendor_id")]
  if "cpu family" in info:
    parts.append(f"family {info['cpu family']} model {info.get('model')}")
  return ", ".join(p for p in parts if p) or None


def numpy_simd() -> dict:
  """Which SIMD level NumPy dispatches to, and the NPY_DISABLE_CPU_FEATURES that limited it.

  It matters for the sorts: on AMD Zen 4, NumPy's AVX-512 sort (x86-simd-sort)
  is several times slower than its AVX2 one (see the README's speed section).
  """
  features = _sort.numpy_cpu_features()
  return {"avx512_skx_dispatched": bool(features.get("AVX512_SKX")),
          "avx2_dispatched": bool(features.get("AVX2")),
          "NPY_DISABLE_CPU_FEATURES": os.environ.get("NPY_DISABLE_CPU_FEATURES")}


def best_time(fn, *args, repeats: int = 5, min_seconds: float = 0.0) -> float:
  """Smallest wall time of ``fn(*args)`` (blocked until ready) over ``repeats`` runs.

  The first call (compilation) is not timed. The minimum is the least noisy
  estimate on a shared machine.
  """
  jax.block_until_ready(fn(*args))
  times = []
  start_all = time.perf_counter()
  while len(times) < repeats or time.perf_counter() - start_all < min_seconds:
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t)
  return min(times)


def load_average() -> list[float] | None:
  """The 1, 5 and 15 minute load averages (None where the OS has none)."""
  try:
    return [round(x, 2) for x in os.getloadavg()]
  except OSError:
    return None


def interleaved_times(fns: dict, repeats: int, *, max_seconds: float | None = None,
                      min_seconds: float = 0.0) -> dict:
  """Wall times of each ``fns[name]()`` (blocked until ready), the calls interleaved.

  Round r calls every function once, starting at a different one each round
  (a rotation), so slow drifts of the machine's load, clock or caches hit every
  implementation alike. Call each function once before (compilation, first
  allocations): nothing here warms up. At least ``repeats`` rounds, and more
  until ``min_seconds`` have passed (fast functions get more samples of a noisy
  machine); ``max_seconds`` stops after the round in which the total passes it
  (at least 2 rounds). Returns ``{name: [seconds, ...]}``.
  """
  names = list(fns)
  times = {name: [] for name in names}
  start_all = time.perf_counter()
  r = 0
  while r < repeats or time.perf_counter() - start_all < min_seconds:
    for j in range(len(names)):
      name = names[(r + j) % len(names)]
      t = time.perf_counter()
      jax.block_until_ready(fns[name]())
      times[name].append(time.perf_counter() - t)
    r += 1
    if max_seconds is not None and r >= 2 and time.perf_counter() - start_all > max_seconds:
      break
  return times


def summarize(seconds: list[float]) -> dict:
  """Minimum (the headline: the least noisy on a shared machine) and median of repeats."""
  return {"min_s": min(seconds), "median_s": float(np.median(seconds)), "repeats": len(seconds)}


def write_json_atomic(path: str, payload: dict) -> None:
  """Writes ``payload`` to ``path`` through a temporary file in the same folder and a rename."""
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
  with open(tmp, "w") as f:
    json.dump(payload, f, indent=1)
    f.write("\n")
  os.replace(tmp, path)


def emit(name: str, payload: dict, *, table: Sequence[str] = (), out: str | None = None) -> None:
  """Prints ``table`` (a short summary) on stderr, then the JSON record on stdout: the
  benchmark's ``name``, :func:`environment` and ``payload``; also writes it to ``out``
  (atomically) when given."""
  for line in table:
    print(line, file=sys.stderr)
  record = {"benchmark": name, **environment(), **payload}
  print(json.dumps(record, indent=1))
  if out:
    write_json_atomic(out, record)


def train_step_setup(config, dataset, mesh, *, fused_norm_relu_pool: bool = True):
  """The ``cwsa-jax train`` step of ``config`` on ``mesh``, ready to run: a namespace with
  ``step``, ``graphdef``, ``state`` (model, optimizer and train metrics, on the mesh),
  ``images`` and ``labels`` (the training split, cut to whole batches, on the mesh),
  ``on_mesh`` (their sharding), ``n`` and ``steps_per_epoch``."""
  import types  # noqa: PLC0415

  from flax import nnx  # noqa: PLC0415

  from cwsa_jax.training import train  # noqa: PLC0415
  n = len(dataset.train_labels) // config.batch_size * config.batch_size
  steps_per_epoch = n // config.batch_size
  model = train.create_model(config, dataset.num_classes,
                             fused_norm_relu_pool=fused_norm_relu_pool)
  optimizer = train.create_optimizer(config, model, steps_per_epoch)
  graphdef, state = nnx.split((model, optimizer, train.make_train_metrics()))
  on_mesh = train.replicated(mesh)
  return types.SimpleNamespace(
      step=train.make_train_step(config, graphdef, config.epochs * steps_per_epoch, mesh),
      graphdef=graphdef, state=jax.device_put(state, on_mesh), on_mesh=on_mesh,
      images=jax.device_put(dataset.train_images[:n], on_mesh),
      labels=jax.device_put(dataset.train_labels[:n], on_mesh), n=n,
      steps_per_epoch=steps_per_epoch)
