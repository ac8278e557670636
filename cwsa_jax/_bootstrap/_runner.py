"""The host loop: resamples in blocks of jitted calls on host threads, joined in order, and
:func:`reporting`, the progress hook of the command line's progress bars.

:func:`run_blocks` is part of the package's internal surface (the command line's
Ctrl-C handling relies on its short calls).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import contextvars
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp

from cwsa_jax import _public

# Resampled values per jitted call of the host loop (whole chunks, at least one).
BLOCK_ELEMENTS = 1 << 20
# bootstrap_evaluation's cheaper resamples: more per call, so that the buffers of
# one call serve several resamples of a large test set (Poisson: its int8
# multiplicities, one byte per resampled value, are held for the whole block).
EVALUATION_BLOCK_ELEMENTS = 1 << 26
POISSON_BLOCK_ELEMENTS = 1 << 24
# Blocks of resamples computed at once, on host threads: two cores' worth.
BLOCKS_IN_FLIGHT = 2


_REPORT: contextvars.ContextVar[Callable[[int], Any] | None] = contextvars.ContextVar(
    "cwsa_jax_bootstrap_report", default=None)


@contextlib.contextmanager
def reporting(callback: Callable[[int], Any]) -> Iterator[None]:
  """Calls ``callback(k)`` each time k more resamples are done by a bootstrap in this block
  (the command line's progress bars)."""
  token = _REPORT.set(callback)
  try:
    yield
  finally:
    _REPORT.reset(token)


def _traced(*values: Any) -> bool:
  return any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(values))


def run_blocks(block: Callable, num_resamples: int, chunk_size: int, n: int, *,
                block_elements: int | None = None):
  """``block(start, size, num_chunks)`` over the resamples, joined [B, ...].

  The chunks (``size`` resamples each, as in :func:`_map_resamples`) are grouped
  in blocks of about ``BLOCK_ELEMENTS`` resampled values. Up to
  :data:`BLOCKS_IN_FLIGHT` blocks run at once on host threads (each block's
  loop over its chunks is sequential, so two use two cores); blocks start in
  order and are joined in order, so the result does not depend on the timing,
  and a KeyboardInterrupt is raised within about one block.
  """
  num_chunks = -(-num_resamples // chunk_size)
  size = -(-num_resamples // num_chunks)
  per_block = max(1, min(num_chunks, (block_elements or BLOCK_ELEMENTS) // (size * n)))
  report = _REPORT.get()
  starts = list(range(0, num_chunks, per_block))
  # (The host threads run with the caller's 64-bit mode: JAX's settings are per thread.)
  run = _public.in_caller_mode(
      lambda first: jax.block_until_ready(block(jnp.uint32(first * size), size, per_block)))
  parts, done = [], 0

  def collect(future) -> None:  # the oldest block, in order
    nonlocal done
    parts.append(future.result())
    if report is not None:
      now = min(num_resamples, len(parts) * per_block * size)
      report(now - done)
      done = now

  with concurrent.futures.ThreadPoolExecutor(BLOCKS_IN_FLIGHT) as pool:
    pending = collections.deque()
    try:
      for first in starts:
        pending.append(pool.submit(run, first))
        if len(pending) == BLOCKS_IN_FLIGHT:
          collect(pending.popleft())
      while pending:
        collect(pending.popleft())
    except BaseException:
      for future in pending:
        future.cancel()
      raise
  return jax.tree.map(lambda *xs: jnp.concatenate(xs)[:num_resamples], *parts)
