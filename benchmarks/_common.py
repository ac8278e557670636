"""Shared helpers for the benchmark scripts: timing, environment record, JSON output."""

from __future__ import annotations

import json
import os
import platform
import sys
import time

import jax
import numpy as np


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
  }


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


def emit(name: str, payload: dict, table: list[str]) -> None:
  """Prints the short table, then one JSON line (the machine-readable record)."""
  for line in table:
    print(line, file=sys.stderr)
  print(json.dumps({"benchmark": name, **environment(), **payload}, indent=1))
