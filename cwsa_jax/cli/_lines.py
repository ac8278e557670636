"""The lines of a binary file in blocks of bytes, as the CSV reader takes them."""

from __future__ import annotations

import io

import numpy as np

READ_BYTES = 1 << 18  # the least the line reader asks the file for at a time


class Lines:
  """The lines of a binary file handed out in blocks of bytes, as ``islice`` over the file
  would give them (split after each LF), without a Python object per line."""

  def __init__(self, f):
    self._f = f
    self._buf = b""
    self._pos = 0      # where the next line starts in _buf
    self._lfs = 0      # how many LFs _buf holds from _pos on
    self._eof = False

  def take(self, n: int) -> tuple[bytes, int]:
    """The next ``n`` lines (fewer at the end of the file) as one bytes object, and how many."""
    while self._lfs < n and not self._eof:
      self._fill()
    if self._lfs >= n:
      end = _after_line_ends(self._buf, self._pos, n)
      self._lfs -= n
    else:  # the end of the file: what is left, maybe a last line without a line end
      end = len(self._buf)
      n = self._lfs + int(end > self._pos and self._buf[end - 1] != 10)
      self._lfs = 0
    block = self._buf[self._pos:end]
    self._pos = end
    return block, n

  def readline(self) -> bytes:
    """The next line, b"" at the end of the file."""
    return self.take(1)[0]

  def _fill(self) -> None:
    rest = self._buf[self._pos:]
    data = self._f.read(max(READ_BYTES, len(rest)))  # doubling: a long block costs linear time
    if not data:
      self._eof = True
      return
    self._lfs += int(np.count_nonzero(np.frombuffer(data, np.uint8) == 10))
    self._buf, self._pos = rest + data, 0


def _after_line_ends(buf: bytes, start: int, n: int) -> int:
  """The offset just past the ``n``-th LF of ``buf`` from ``start`` on (it has that many).

  Counts in spans that double from ``start``, then halves the span that holds it: the work
  follows the block's length, not the buffer's.
  """
  if n <= 128:  # a few lines: find is cheaper than a NumPy pass
    for _ in range(n):
      start = buf.index(b"\n", start) + 1
    return start
  data = np.frombuffer(buf, np.uint8)
  span = 1 << 12
  while True:
    end = min(start + span, len(buf))
    count = int(np.count_nonzero(data[start:end] == 10))
    if count >= n:
      break
    start, n, span = end, n - count, 2 * span
  while end - start > 1 << 12:
    middle = (start + end) // 2
    count = int(np.count_nonzero(data[start:middle] == 10))
    if count >= n:
      end = middle
    else:
      start, n = middle, n - count
  return start + int(np.flatnonzero(data[start:end] == 10)[n - 1]) + 1


def split_lines(block: bytes) -> list[bytes]:
  """A block's lines, each with its LF (the last one maybe without)."""
  return io.BytesIO(block).readlines()
