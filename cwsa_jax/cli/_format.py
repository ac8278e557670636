"""Numbers and tables as the reports print them (Markdown in report.md, plain text on stdout)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

EMPTY_CELL = "0 (S empty)"


def _decimals(v: float, digits: int, significant: int) -> int:
  """Decimals that show ``v`` with at least ``digits`` decimals and ``significant`` digits."""
  if v == 0:
    return digits
  return max(digits, significant - 1 - math.floor(math.log10(abs(v))))


def fmt(x: Any, digits: int = 4, *, significant: int = 3) -> str:
  """A number with ``digits`` decimals, more where needed to keep ``significant`` digits.

  0.9647 stays ``0.9647``, 0.000813 is ``0.000813`` (not ``0.0008``), exactly
  0 is ``0``; below 1e-8 in magnitude, scientific notation. NaN / None: an em dash.
  """
  if x is None:
    return "—"
  v = float(x)
  if not math.isfinite(v):
    return "—"
  if v == 0:
    return "0"
  decimals = _decimals(v, digits, significant)
  if decimals > 8:
    return f"{v:.{significant - 1}e}"
  return f"{v:.{decimals}f}"


def fmt_pm(mean: Any, std: Any, digits: int = 4, *, significant: int = 3) -> str:
  """``mean ± std``, both with the decimals :func:`fmt` gives the mean."""
  if mean is None or not math.isfinite(float(mean)):
    return "—"
  m, s = float(mean), float(std)
  if m == 0 and s == 0:
    return "0 ± 0"
  decimals = _decimals(m if m != 0 else s, digits, significant)
  if decimals > 8:
    return f"{m:.{significant - 1}e} ± {s:.1e}"
  return f"{m:.{decimals}f} ± {s:.{decimals}f}"


def fmt_convention(value: Any, coverage: Any, std: Any = None) -> str:
  """CWSA / CWSA+ cell: :data:`EMPTY_CELL` where nothing is retained (coverage 0), else the value."""
  if float(coverage) == 0:
    return EMPTY_CELL
  return fmt(value) if std is None else fmt_pm(value, std)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
                   align: str | None = None) -> str:
  """A GitHub-flavoured Markdown table; ``align`` is one of l/r/c per column."""
  align = align or "l" + "r" * (len(headers) - 1)
  marks = {"l": ":---", "r": "---:", "c": ":---:"}
  lines = ["| " + " | ".join(headers) + " |",
           "| " + " | ".join(marks[a] for a in align) + " |"]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def text_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  """A plain-text table for the terminal (first column left-aligned)."""
  cells = [list(map(str, headers))] + [list(map(str, r)) for r in rows]
  widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

  def line(r):
    return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

  return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]])


def selected_rows(thresholds: np.ndarray, max_rows: int = 12) -> list[int]:
  """Indices of a readable subset of the grid: every 0.05 plus the last point."""
  t = np.asarray(thresholds, np.float64)
  if t.size <= max_rows:
    return list(range(t.size))
  marks = np.arange(0.5, 1.0, 0.05)
  picked = {int(np.argmin(np.abs(t - m))) for m in marks if t.min() - 0.01 <= m <= t.max() + 0.01}
  picked.add(t.size - 1)
  picked.add(0)
  return sorted(picked)
