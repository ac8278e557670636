"""Test-session hooks for every collected test (tests/ and the doctests of cwsa_jax/ and training/)."""

import gc
import os
import sys

import pytest

# Clear JAX's caches at the next file boundary once this process holds more memory mappings.
MAX_MAPPINGS = 25_000


def _mappings() -> int | None:
  """How many memory mappings this process holds (Linux), else None."""
  try:
    with open(f"/proc/{os.getpid()}/maps", "rb") as f:
      return sum(1 for _ in f)
  except OSError:
    return None


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
  """Drops JAX's compiled programs when a worker that holds many moves on to another file.

  Each XLA:CPU executable holds about 18 memory mappings, and a process may
  hold at most ``vm.max_map_count`` of them (65,530 by default on Linux). A
  pytest worker that kept the compiled programs of half the suite (thousands
  of shapes and static arguments) reached that limit, and its next compilation
  died with a segmentation fault. Between two files, a worker holding more
  than :data:`MAX_MAPPINGS` mappings (or any worker, where they cannot be
  counted) clears JAX's caches; the programs still in use compile again.
  """
  if "jax" not in sys.modules or (nextitem is not None and nextitem.path == item.path):
    return
  count = _mappings()
  if count is None or count > MAX_MAPPINGS:
    sys.modules["jax"].clear_caches()
    gc.collect()
