"""Reading a predictions CSV in blocks of rows, with pyarrow's or NumPy's C parser.

The file is read as bytes, a block of ``chunk_rows`` lines at a time, so memory
stays bounded by the block (plus the arrays the caller keeps). Each block is
parsed by one of three paths that accept exactly the same files:

* the arrow path hands the block to :func:`pyarrow.csv.read_csv` with the
  needed columns' types given (pyarrow is an optional extra, imported on first
  use); like the fast path it gives up on anything unusual, so its accepted
  values are the careful path's and every error message comes from there;
* the fast path hands the block to :func:`numpy.loadtxt` (its C parser) for the
  needed columns only, and checks every value with vectorised NumPy; it gives up
  (returns ``None``) on anything unusual: a quote character, a malformed or
  out-of-range value, a blank-looking row, a field-count mismatch;
* the careful path parses the block with :mod:`csv` row by row. It is the
  reference: it either returns the same arrays or raises a
  :class:`~cwsa_jax.cli._util.UserError` naming the file, the line and the cell.

:func:`iter_csv_chunks` takes any of them (``parsers``), trying them in that order;
tests pass one or two, to compare each path with the careful one.

Bytes are decoded as Latin-1 (every byte is valid), so a byte that is not UTF-8
in a column the kit does not read never rejects the file; only text that is
shown is decoded as UTF-8: class names must be UTF-8 (a Latin-1 or Windows-1252
name is refused in one line naming the line and the byte, not shown mangled in
the report), group labels show invalid bytes as backslash escapes, and cells in
messages as U+FFFD.
"""

from __future__ import annotations

import csv
import io
import os
import re
import warnings
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

import numpy as np

from cwsa_jax.cli import _arrow_csv
from cwsa_jax.cli import _lines
from cwsa_jax.cli._util import UserError

DEFAULT_CHUNK_ROWS = 1 << 16
PARSERS = ("arrow", "fast", "careful")
DELIMITERS = (",", ";", "\t", "|")
CONFIDENCE_SLACK = 1e-6
LABEL_COLUMNS = ("y_true", "y_pred", "confidence")
CORRECT_COLUMNS = ("confidence", "correct")
_TRUE = ("1", "1.0", "true", "t", "yes")
_FALSE = ("0", "0.0", "false", "f", "no")
_SPACE = " \t\r\n\x0b\x0c"          # ASCII whitespace: stripping never cuts a UTF-8 character
_MAX_EXACT_LABEL = 2.0 ** 53        # integer labels beyond this are not exact in float64
_BOOL_WIDTH, _NAME_WIDTH = 16, 64   # fast-path text fields; a cell this long takes the careful path
_SHOWN_CHARS = 60
_BOM = b"\xef\xbb\xbf"
_CONTENT = re.compile(rb"[^\r\n]")  # a byte that is not a line end


class CsvChunk(NamedTuple):
  """One block of rows of a predictions CSV, parsed and checked.

  Attributes:
    confidences: float64 [m] in [0, 1] (values within 1e-6 outside are clipped).
    correct: bool [m].
    y_true: [m] int64 class labels, or str class names; None for a
      ``confidence,correct`` file.
    y_pred: [m] like ``y_true``.
    groups: str [m] cells of the ``group_by`` column (stripped), else None.
    first_line: the 1-based line number of the block's first line (the header
      is counted).
    last_line: the line number of its last line.
  """
  confidences: np.ndarray
  correct: np.ndarray
  y_true: np.ndarray | None
  y_pred: np.ndarray | None
  groups: np.ndarray | None
  first_line: int
  last_line: int


class _Layout(NamedTuple):
  """What the header says: delimiter, width and the needed columns' indices."""
  delimiter: str
  width: int
  columns: dict           # name -> column index, in LABEL_COLUMNS / CORRECT_COLUMNS order
  group: int | None       # column index of group_by
  group_name: str | None


class _LabelKind:
  """Whether the file's class labels are integers or names, and where that was decided."""

  def __init__(self):
    self.kind: str | None = None   # "int" or "name"
    self.line = 0
    self.cell = ""

  def settle(self, kind: str, line: int, cell: str) -> None:
    if self.kind is None:
      self.kind, self.line, self.cell = kind, line, cell


def iter_csv_chunks(path: str | os.PathLike, chunk_rows: int = DEFAULT_CHUNK_ROWS, *,
                    group_by: str | None = None,
                    parsers: tuple[str, ...] | None = None) -> Iterator[CsvChunk]:
  """Yields the rows of a predictions CSV in blocks, parsed and checked.

  The header (the first non-blank line) names either the columns
  ``y_true,y_pred,confidence`` or ``confidence,correct`` (case-insensitive, in
  any order, other columns ignored; ``correct`` wins when both sets are present);
  the delimiter is the first of ``, ; TAB |`` that splits the header into them.
  Class labels are integers or class names (all one or the other); ``correct``
  is 0/1, true/false, t/f or yes/no. Blank lines are skipped; quoted fields
  (also over several lines) follow the :mod:`csv` rules; a UTF-8 byte-order mark
  and CRLF line ends are accepted.

  Args:
    path: the CSV file.
    chunk_rows: lines read per block; a block holds at most this many rows
      (fewer where lines are blank; a quoted field that runs over the block's
      last line extends it).
    group_by: a column of group labels to return with the rows.
    parsers: the block parsers to try, of :data:`PARSERS`, in that order: the
      arrow path, then the fast one, where they take a block, else the careful
      one. Without the careful path, a block the others give up on raises
      ``RuntimeError``; ``("careful",)`` parses every block the reference way.
      None: :func:`default_parsers`.

  Yields:
    :class:`CsvChunk` per block with at least one row.

  Raises:
    UserError: the file cannot be read, has no usable header or no data rows,
      or a row is malformed; the message names the file, the line and the cell.
    ValueError: ``chunk_rows`` is not a positive integer, or ``parsers`` names
      none or others than :data:`PARSERS`.
    ImportError: ``parsers`` names the arrow path and pyarrow is not installed.
  """
  if (isinstance(chunk_rows, bool) or not isinstance(chunk_rows, (int, np.integer))
      or chunk_rows < 1):
    raise ValueError(f"chunk_rows must be a positive integer, got {chunk_rows!r}")
  if parsers is None:
    parsers = default_parsers()
  if not parsers or not set(parsers) <= set(PARSERS):
    raise ValueError(f"parsers must be some of {PARSERS}, got {parsers!r}")
  if "arrow" in parsers and _arrow_csv.modules() is None:
    raise ImportError("the arrow CSV path needs pyarrow: pip install 'cwsa-jax[parquet]'")
  return _read(Path(path), int(chunk_rows), group_by, tuple(parsers))


def default_parsers() -> tuple[str, ...]:
  """All of :data:`PARSERS` where pyarrow is installed, else the fast and careful paths."""
  return PARSERS if _arrow_csv.modules() is not None else ("fast", "careful")


def _read(path: Path, chunk_rows: int, group_by: str | None,
          parsers: tuple[str, ...]) -> Iterator[CsvChunk]:
  try:
    with open(path, "rb") as f:
      yield from _chunks(path, f, chunk_rows, group_by, parsers)
  except OSError as e:
    raise UserError(f"{path}: cannot read: {e.strerror or e}") from None


def _chunks(path: Path, f, chunk_rows: int, group_by: str | None,
            parsers: tuple[str, ...]) -> Iterator[CsvChunk]:
  layout, number = _read_header(path, f, group_by)
  labels = _LabelKind()
  source = _lines.Lines(f)
  arrow = _arrow_csv.ArrowReader(layout) if "arrow" in parsers else None
  rows = 0

  def more() -> str | None:  # one more line for a quoted field that runs past a block
    nonlocal number
    line = source.readline()
    if not line:
      return None
    number += 1
    _check_nul(path, line, number)
    return line.decode("latin-1")

  while True:
    block, count = source.take(chunk_rows)
    if not count:
      break
    first, number = number + 1, number + count
    lines = None
    if b"\x00" in block:
      lines = _lines.split_lines(block)
      for i, line in enumerate(lines):
        _check_nul(path, line, first + i)
    chunk = None
    if arrow is not None:
      chunk = _arrow_block(path, layout, labels, arrow, block, first)
    if chunk is None and "fast" in parsers and b'"' not in block:
      lines = _lines.split_lines(block) if lines is None else lines
      chunk = _fast_block(path, layout, labels, block, lines, first)
    if chunk is None:
      if "careful" not in parsers:
        tried = " and ".join(parsers)
        raise RuntimeError(f"{path}: lines {first}-{number}: the {tried} path"
                           f"{'s' if len(parsers) > 1 else ''} gave up on the block and "
                           f"parsers={parsers!r} has no careful path")
      lines = _lines.split_lines(block) if lines is None else lines
      text = [line.decode("latin-1") for line in lines]
      records = _records(path, text, first, more, layout.delimiter)
      chunk = _careful_block(path, layout, labels, records)
    if chunk is not None and chunk.confidences.size:
      rows += chunk.confidences.size
      yield chunk._replace(first_line=first, last_line=number)
  if not rows:
    raise UserError(f"{path}: no data rows after the header")


def _check_nul(path: Path, line: bytes, number: int) -> None:
  if b"\x00" in line:
    raise UserError(f"{path}: line {number}: NUL byte: not a text CSV file")


# --------------------------------------------------------------------------
# Header
# --------------------------------------------------------------------------


def _read_header(path: Path, f, group_by: str | None) -> tuple[_Layout, int]:
  """Reads up to the first non-blank line; returns the layout and that line's number."""
  number = 0
  while True:
    raw = f.readline()
    number += 1
    if not raw:
      raise UserError(f"{path}: empty file (expected a header with y_true,y_pred,confidence "
                      "or confidence,correct)")
    if number == 1:
      if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise UserError(f"{path}: UTF-16 text (byte-order mark); save it as UTF-8")
      raw = raw.removeprefix(b"\xef\xbb\xbf")
    _check_nul(path, raw, number)
    text = raw.decode("latin-1").rstrip("\r\n")
    if "\r" in text:
      raise UserError(f"{path}: line {number}: bare CR line ends (old Mac style); save the file "
                      "with LF or CRLF line ends")
    if text.strip(_SPACE + "".join(DELIMITERS) + '"'):
      break
  splits = []
  for delimiter in DELIMITERS:
    fields = _split_line(text, delimiter)
    names = [h.strip(_SPACE).lower() for h in fields]
    wanted = wanted_columns(names)
    if wanted is not None:
      return _layout(path, delimiter, fields, names, wanted, group_by), number
    splits.append((len(fields), delimiter, fields, names))
  _, delimiter, fields, names = max(splits, key=lambda s: s[0])  # the most fields: the best guess
  guess = f" (delimiter {delimiter!r})" if delimiter != "," else ""
  raise missing_columns(
      path, names, f"{_shown(delimiter.join(h.strip(_SPACE) for h in fields), quote=False)}{guess}")


def _split_line(text: str, delimiter: str) -> list[str]:
  try:
    return next(csv.reader([text], delimiter=delimiter), [])
  except csv.Error:
    return text.split(delimiter)


def wanted_columns(names: list[str]) -> tuple[str, ...] | None:
  """The layout of a header's ``names`` (stripped, lower-cased): CORRECT_COLUMNS when it has
  them, else LABEL_COLUMNS when it has them, else None. (CSV and Parquet alike.)"""
  if "confidence" in names and "correct" in names:
    return CORRECT_COLUMNS
  if set(LABEL_COLUMNS) <= set(names):
    return LABEL_COLUMNS
  return None


def missing_columns(path: Path, names: list[str], found: str) -> UserError:
  """The error for a header ``names`` with neither layout: the columns missing from the nearer
  one; ``found`` is the header as the message shows it."""
  missing_a = [c for c in LABEL_COLUMNS if c not in names]
  missing_b = [c for c in CORRECT_COLUMNS if c not in names]
  missing = missing_a if len(missing_a) <= len(missing_b) else missing_b
  return UserError(f"{path}: missing column(s) {', '.join(missing)}; expected the columns "
                   f"y_true,y_pred,confidence or confidence,correct, found {found}")


def group_column(path: Path, names: list[str], wanted: tuple[str, ...], group_by: str | None,
                 *, found: str, where: str) -> str | None:
  """The key (stripped, lower-cased) of the --group-by column in ``names``, None without one.

  Refuses a --group-by column that ``names`` lacks and a needed column that stands twice;
  ``found`` is the header and ``where`` what it is ("header", "file") as messages show them.
  """
  needed = list(wanted)
  group_key = None
  if group_by is not None:
    group_key = group_by.strip().lower()
    if not group_key or group_key not in names:
      raise UserError(f"{path}: --group-by column {group_by!r} not found; the {where} has {found}")
    needed.append(group_key)
  for name in needed:
    if names.count(name) > 1:
      raise UserError(f"{path}: duplicate column {name!r} in the {where}")
  return group_key


def _layout(path: Path, delimiter: str, fields: list[str], names: list[str],
            wanted: tuple[str, ...], group_by: str | None) -> _Layout:
  found = _shown(delimiter.join(h.strip(_SPACE) for h in fields), quote=False)
  group_key = group_column(path, names, wanted, group_by, found=found, where="header")
  columns = {name: names.index(name) for name in wanted}
  group = names.index(group_key) if group_key is not None else None
  return _Layout(delimiter, len(fields), columns, group,
                 group_by.strip() if group_by is not None else None)


# --------------------------------------------------------------------------
# Arrow path: pyarrow's CSV parser on a block without quotes
# --------------------------------------------------------------------------


def _arrow_block(path: Path, layout: _Layout, labels: _LabelKind, arrow: _arrow_csv.ArrowReader,
                 block: bytes, first: int) -> CsvChunk | None:
  """The block parsed by pyarrow, or None if anything needs the careful path.

  Blocks with a quote, a bare CR or a leading byte-order mark are left to the other paths:
  pyarrow would read them differently from the csv module.
  """
  if (b'"' in block or block.startswith(_BOM)
      or (b"\r" in block and block.count(b"\r") != block.count(b"\r\n"))
      or (layout.group is not None and layout.group in layout.columns.values())):
    return None
  start = _CONTENT.search(block)
  if start is None:  # only line ends: no rows
    return CsvChunk(np.empty(0), np.empty(0, bool), None, None, None, first, first)
  kinds = [labels.kind] if labels.kind is not None else ["int", "name"]
  if "y_true" not in layout.columns:
    kinds = [None]
  for kind in kinds:
    table = arrow.read(block, kind)
    if table is not None:
      break
  else:
    return None
  columns = {name: table.column(arrow.names[i]) for name, i in layout.columns.items()}
  if any(column.null_count for column in columns.values()):
    return None
  conf = columns["confidence"].to_numpy()
  if not (np.all(conf >= -CONFIDENCE_SLACK) and np.all(conf <= 1.0 + CONFIDENCE_SLACK)):
    return None  # NaN fails both comparisons
  conf = np.clip(conf, 0.0, 1.0)
  y_true = y_pred = groups = None
  if kind is None:
    cells, ((codes, _),) = _distinct_cells([columns["correct"]])
    truth = [cell.lower() for cell in cells]
    if not all(v in _TRUE or v in _FALSE for v in truth):
      return None
    correct = np.array([v in _TRUE for v in truth], dtype=bool)[codes]
  elif kind == "int":
    ints = _integer_labels(columns["y_true"].to_numpy(), columns["y_pred"].to_numpy())
    if ints is None:
      return None
    y_true, y_pred = ints
    correct = y_true == y_pred
  else:
    cells, ((true_codes, true_used), (pred_codes, pred_used)) = _distinct_cells(
        [columns["y_true"], columns["y_pred"]])
    if not all(cells) or any(_is_number(cell) for cell in cells):
      return None
    names = _utf8(np.array(cells, dtype=str))[0]
    if names is None:
      return None
    names = names.tolist()
    y_true, y_pred = _pick(names, true_codes, true_used), _pick(names, pred_codes, pred_used)
    correct = true_codes == pred_codes
  if layout.group is not None:
    cells, ((codes, used),) = _distinct_cells([table.column(arrow.names[layout.group])])
    if not all(cells):
      return None
    groups = _pick([_text(cell) for cell in cells], codes, used)
  if kind is not None and labels.kind is None:
    line_start = start.start()
    line_end = block.find(b"\n", line_start)
    line = block[line_start:] if line_end < 0 else block[line_start:line_end]
    labels.settle(kind, first + block.count(b"\n", 0, line_start), _cell(layout, line, "y_true"))
  return CsvChunk(conf, correct, y_true, y_pred, groups, first, first)


def _distinct_cells(columns) -> tuple[list[str], list[tuple[np.ndarray, set[int]]]]:
  """The distinct stripped cells (Latin-1-decoded) of dictionary-encoded pyarrow columns, and
  per column its codes into them (equal codes: equal stripped cells) and the codes it uses."""
  index: dict[str, int] = {}
  out = []
  for column in columns:
    parts, used = [np.empty(0, np.int64)], set()
    for chunk in column.chunks:  # pyarrow's dictionary of a chunk holds the values it has
      lut = [index.setdefault(raw.decode("latin-1").strip(_SPACE), len(index))
             for raw in chunk.dictionary.to_pylist()]
      used.update(lut)
      parts.append(np.array(lut, dtype=np.int64)[chunk.indices.to_numpy()] if lut
                   else np.empty(0, np.int64))
    out.append((np.concatenate(parts), used))
  return list(index), out


def _pick(texts: list[str], codes: np.ndarray, used: set[int]) -> np.ndarray:
  """``texts[codes]`` as a str array as wide as the longest text used (as ``np.array`` of the
  cells would be)."""
  width = max((len(texts[k]) for k in used), default=1)
  return np.array(texts, dtype=f"U{max(width, 1)}")[codes]


def _cell(layout: _Layout, line: bytes, name: str) -> str:
  """A column's cell (stripped) of an unquoted line, as the careful path reads it."""
  fields = line.rstrip(b"\r\n").decode("latin-1").split(layout.delimiter)
  return fields[layout.columns[name]].strip(_SPACE)


# --------------------------------------------------------------------------
# Fast path: numpy.loadtxt on a block without quotes
# --------------------------------------------------------------------------


def _fast_block(path: Path, layout: _Layout, labels: _LabelKind, block: bytes,
                lines: list[bytes], first: int) -> CsvChunk | None:
  """The block parsed by NumPy, or None if anything needs the careful path."""
  if layout.group is not None and layout.group in layout.columns.values():
    return None
  present = _present_lines(layout, block, lines)
  if present is None:
    return None
  if not present.size:
    return None
  kinds = [labels.kind] if labels.kind is not None else ["int", "name"]
  if "y_true" not in layout.columns:
    kinds = [None]
  for kind in kinds:
    table = _loadtxt(layout, block, kind)
    if table is not None:
      break
  else:
    return None
  if len(table) != present.size:
    return None
  conf = table["confidence"]
  if not (np.all(conf >= -CONFIDENCE_SLACK) and np.all(conf <= 1.0 + CONFIDENCE_SLACK)):
    return None  # NaN fails both comparisons
  conf = np.clip(conf, 0.0, 1.0)
  y_true = y_pred = groups = None
  if kind is None:
    correct = _fast_bools(table["correct"])
    if correct is None:
      return None
  elif kind == "int":
    ints = _integer_labels(table["y_true"], table["y_pred"])
    if ints is None:
      return None
    y_true, y_pred = ints
    correct = y_true == y_pred
  else:
    y_true, y_pred = _fast_text(table["y_true"]), _fast_text(table["y_pred"])
    if y_true is None or y_pred is None:
      return None
    if any(_is_number(v) for v in np.unique(np.concatenate([y_true, y_pred])).tolist()):
      return None
    correct = y_true == y_pred
    y_true, y_pred = _class_names(path, y_true, y_pred, first + present)
  if layout.group is not None:
    groups = _fast_text(table["group"])
    if groups is None:
      return None
    groups = _display(groups)
  if kind is not None:
    row = int(present[0])
    labels.settle(kind, first + row, _cell(layout, lines[row], "y_true"))
  return CsvChunk(conf, correct, y_true, y_pred, groups, first, first)


def _integer_labels(y_true: np.ndarray, y_pred: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray] | None:
  """float64 label columns as int64, or None where a value is not a whole number that float64
  holds exactly (the block then takes the careful path, which names it)."""
  for values in (y_true, y_pred):
    if not (np.all(np.abs(values) <= _MAX_EXACT_LABEL) and np.all(values == np.round(values))):
      return None
  return y_true.astype(np.int64), y_pred.astype(np.int64)


def _present_lines(layout: _Layout, block: bytes, lines: list[bytes]) -> np.ndarray | None:
  """Indices of the block's non-empty lines if each has the header's field count, else None."""
  buf = np.frombuffer(block, np.uint8)
  lengths = np.fromiter(map(len, lines), np.int64, len(lines))
  ends = np.cumsum(lengths)
  last = ends - 1
  has_lf = buf[last] == 10
  content = lengths - has_lf
  has_cr = (content > 0) & (buf[np.maximum(last - has_lf, 0)] == 13)
  content = content - has_cr
  present = np.flatnonzero(content > 0)
  counts = np.add.reduceat(buf == ord(layout.delimiter), ends - lengths, dtype=np.int64)
  if not np.all(counts[present] == layout.width - 1):
    return None
  return present


def _loadtxt(layout: _Layout, block: bytes, kind: str | None) -> np.ndarray | None:
  label_type = np.float64 if kind == "int" else f"U{_NAME_WIDTH}"
  types = {"confidence": np.float64, "correct": f"U{_BOOL_WIDTH}", "y_true": label_type,
           "y_pred": label_type}
  fields = [(name, types[name], index) for name, index in layout.columns.items()]
  if layout.group is not None:
    fields.append(("group", f"U{_NAME_WIDTH}", layout.group))
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      return np.loadtxt(io.BytesIO(block), encoding="latin-1", delimiter=layout.delimiter,
                        dtype=np.dtype([(name, t) for name, t, _ in fields]),
                        usecols=[index for _, _, index in fields], comments=None, quotechar=None,
                        ndmin=1)
  except ValueError:
    return None


def _fast_text(cells: np.ndarray) -> np.ndarray | None:
  """Stripped text cells, or None when one may have been cut to the field width or is empty."""
  if cells.size and int(np.strings.str_len(cells).max()) >= cells.dtype.itemsize // 4:
    return None
  cells = np.strings.strip(cells, _SPACE)
  if not np.all(np.strings.str_len(cells) > 0):
    return None
  return cells


def _fast_bools(cells: np.ndarray) -> np.ndarray | None:
  cells = _fast_text(cells)
  if cells is None:
    return None
  cells = np.strings.lower(cells)
  true = np.isin(cells, _TRUE)
  if not np.all(true | np.isin(cells, _FALSE)):
    return None
  return true


# --------------------------------------------------------------------------
# Careful path: the csv module, row by row, with line numbers in every error
# --------------------------------------------------------------------------


def _records(path: Path, lines: list[str], first: int, more: Callable[[], str | None],
             delimiter: str) -> list[tuple[int, list[str]]]:
  """(line number, fields) of each record that starts in ``lines``.

  A quoted field still open at the last line pulls further lines from ``more``.
  """
  def feed():
    yield from lines
    while (line := more()) is not None:
      yield line

  reader = csv.reader(feed(), delimiter=delimiter)
  out = []
  start = first
  try:
    for fields in reader:
      out.append((start, fields))
      start = first + reader.line_num
      if reader.line_num >= len(lines):
        break
  except csv.Error as e:
    line = first + reader.line_num - 1
    if "new-line character" in str(e):
      raise UserError(f"{path}: line {line}: a carriage return (CR) inside an unquoted field; "
                      "quote the field or remove the CR") from None
    raise UserError(f"{path}: line {line}: cannot parse the CSV ({e})") from None
  return out


def _careful_block(path: Path, layout: _Layout, labels: _LabelKind,
                   records: list[tuple[int, list[str]]]) -> CsvChunk | None:
  rows = [(line, fields) for line, fields in records if any(c.strip(_SPACE) for c in fields)]
  if not rows:
    return None
  for line, fields in rows:
    if len(fields) != layout.width:
      hint = ""
      joined = layout.delimiter.join(fields)
      others = [d for d in DELIMITERS if d != layout.delimiter and d in joined]
      if len(fields) == 1 and others:
        hint = f" (delimiter {others[0]!r}?)"
      raise UserError(f"{path}: line {line} has {len(fields)} field(s), the header has "
                      f"{layout.width}{hint}")
  lines = [line for line, _ in rows]
  cells = {name: [fields[i].strip(_SPACE) for _, fields in rows]
           for name, i in layout.columns.items()}
  comma = layout.delimiter != ","
  conf = _float_cells(path, cells["confidence"], "confidence", lines, comma)
  conf = _check_range(path, conf, cells["confidence"], lines)
  y_true = y_pred = groups = None
  if "correct" in cells:
    correct = _bool_cells(path, cells["correct"], lines)
  else:
    y_true, y_pred = _label_cells(path, labels, cells["y_true"], cells["y_pred"], lines, comma)
    correct = y_true == y_pred
    if y_true.dtype.kind == "U":
      y_true, y_pred = _class_names(path, y_true, y_pred, lines)
  if layout.group is not None:
    group_cells = [fields[layout.group].strip(_SPACE) for _, fields in rows]
    _check_not_empty(path, group_cells, layout.group_name, lines)
    groups = _display(np.array(group_cells, dtype=str))
  return CsvChunk(conf, correct, y_true, y_pred, groups, lines[0], lines[-1])


def _check_not_empty(path: Path, cells: list[str], name: str, lines: list[int]) -> None:
  for i, cell in enumerate(cells):
    if cell == "":
      raise UserError(f"{path}: line {lines[i]}: empty {name} cell")


def _is_number(cell: str) -> bool:
  try:
    _to_float(cell)
  except ValueError:
    return False
  return True


def _to_float(cell: str) -> float:
  """``float`` without the digit separators NumPy's parser rejects (``1_000``)."""
  if "_" in cell:
    raise ValueError(cell)
  return float(cell)


def _float_cells(path: Path, cells: list[str], name: str, lines: list[int],
                 comma_hint: bool) -> np.ndarray:
  _check_not_empty(path, cells, name, lines)
  values = np.empty(len(cells), dtype=np.float64)
  for i, cell in enumerate(cells):
    try:
      values[i] = _to_float(cell)
    except ValueError:
      hint = " (decimal comma? write 0.9, not 0,9)" if comma_hint and _decimal_comma(cell) else ""
      raise UserError(f"{path}: line {lines[i]}: {name} {_shown(cell)} is not a number"
                      f"{hint}") from None
  bad = np.flatnonzero(~np.isfinite(values))
  if bad.size:
    i = int(bad[0])
    raise UserError(f"{path}: line {lines[i]}: {name} {_shown(cells[i])} is not a finite number")
  return values


def _decimal_comma(cell: str) -> bool:
  return _is_number(cell.replace(",", ".", 1)) and "," in cell


def _check_range(path: Path, values: np.ndarray, cells: list[str], lines: list[int]) -> np.ndarray:
  bad = np.flatnonzero((values < -CONFIDENCE_SLACK) | (values > 1.0 + CONFIDENCE_SLACK))
  if bad.size:
    i = int(bad[0])
    span = f"lines {lines[0]}-{lines[-1]}" if len(lines) > 1 else f"line {lines[0]}"
    raise UserError(f"{path}: line {lines[i]}: confidence {values[i]:.6g} is outside [0, 1] "
                    f"({bad.size} value(s) out of range in {span})")
  return np.clip(values, 0.0, 1.0)


def _bool_cells(path: Path, cells: list[str], lines: list[int]) -> np.ndarray:
  out = np.empty(len(cells), dtype=bool)
  for i, cell in enumerate(cells):
    v = cell.lower()
    if v in _TRUE:
      out[i] = True
    elif v in _FALSE:
      out[i] = False
    elif v == "":
      raise UserError(f"{path}: line {lines[i]}: empty correct cell")
    else:
      raise UserError(f"{path}: line {lines[i]}: correct {_shown(cell)} must be 0/1 or true/false")
  return out


def _label_cells(path: Path, labels: _LabelKind, true_cells: list[str], pred_cells: list[str],
                 lines: list[int], comma_hint: bool) -> tuple[np.ndarray, np.ndarray]:
  """Integer labels (int64) or class names (str): all of one kind in the whole file."""
  for i in range(len(lines)):
    for name, cells in (("y_true", true_cells), ("y_pred", pred_cells)):
      cell = cells[i]
      if cell == "":
        raise UserError(f"{path}: line {lines[i]}: empty {name} cell")
      kind = "int" if _is_number(cell) else "name"
      labels.settle(kind, lines[i], cell)
      if kind != labels.kind:
        what = "is not a number" if kind == "name" else "is a number"
        earlier = "the integer label" if labels.kind == "int" else "the class name"
        raise UserError(f"{path}: line {lines[i]}: {name} {_shown(cell)} {what}, but line "
                        f"{labels.line} has {earlier} {_shown(labels.cell)}: class labels must "
                        "be all integers or all names")
  if labels.kind == "name":
    return np.array(true_cells, dtype=str), np.array(pred_cells, dtype=str)
  out = []
  for name, cells in (("y_true", true_cells), ("y_pred", pred_cells)):
    values = _float_cells(path, cells, name, lines, comma_hint)
    bad = np.flatnonzero((values != np.round(values)) | (np.abs(values) > _MAX_EXACT_LABEL))
    if bad.size:
      i = int(bad[0])
      raise UserError(f"{path}: line {lines[i]}: {name} {_shown(cells[i])} is not an integer "
                      "class label" + (" (too large)" if values[i] == np.round(values[i]) else ""))
    out.append(values.astype(np.int64))
  return out[0], out[1]


# --------------------------------------------------------------------------
# Text shown to people
# --------------------------------------------------------------------------


def _text(cell: str) -> str:
  """A Latin-1-decoded cell as the UTF-8 text it holds (invalid bytes as \\x escapes)."""
  return cell.encode("latin-1").decode("utf-8", "backslashreplace")


def _display(cells: np.ndarray) -> np.ndarray:
  """Latin-1-decoded cells as UTF-8 text, decoding each distinct value once."""
  if not cells.size:
    return cells.astype(str)
  unique, inverse = np.unique(cells, return_inverse=True)
  return np.array([_text(u) for u in unique.tolist()], dtype=str)[inverse]


def _utf8(cells: np.ndarray) -> tuple[np.ndarray | None, int | None]:
  """Latin-1-decoded cells as the UTF-8 text they hold (each distinct value decoded once) and
  None; or None and the index of the first cell that is not UTF-8."""
  unique, inverse = np.unique(cells, return_inverse=True)
  texts, bad = [], []
  for k, cell in enumerate(unique.tolist()):
    try:
      texts.append(cell.encode("latin-1").decode("utf-8"))
    except UnicodeDecodeError:
      texts.append("")
      bad.append(k)
  if bad:
    return None, int(np.flatnonzero(np.isin(inverse, bad))[0])
  return np.array(texts, dtype=str)[inverse], None


def _bad_byte(cell: str) -> tuple[int, int]:
  """(offset, value) of the first byte of a Latin-1-decoded cell that is not UTF-8."""
  raw = cell.encode("latin-1")
  try:
    raw.decode("utf-8")
  except UnicodeDecodeError as e:
    return e.start, raw[e.start]
  return len(raw), 0


def _class_names(path: Path, y_true: np.ndarray, y_pred: np.ndarray,
                 lines) -> tuple[np.ndarray, np.ndarray]:
  """Class-name cells (Latin-1-decoded) as the UTF-8 text they hold.

  Raises:
    UserError: a name is not UTF-8 (say a Latin-1 file): the first such cell in the file,
      its line and byte, and how to fix it.
  """
  if not y_true.size:
    return y_true.astype(str), y_pred.astype(str)
  columns = (("y_true", y_true), ("y_pred", y_pred))
  decoded = [_utf8(cells) for _, cells in columns]
  bad = [(first, k) for k, (_, first) in enumerate(decoded) if first is not None]
  if bad:
    first, k = min(bad)
    name, cells = columns[k]
    offset, byte = _bad_byte(cells[first])
    raise UserError(f"{path}: line {int(lines[first])}: {name} {_shown(cells[first])} is not "
                    f"UTF-8 text (byte 0x{byte:02x} at byte {offset} of the cell); the file "
                    "looks Latin-1 or Windows-1252 encoded: save it as UTF-8 "
                    "(e.g. iconv -f latin1 -t utf-8)")
  return decoded[0][0], decoded[1][0]


def _shown(cell: str, *, quote: bool = True) -> str:
  """``repr`` of a cell for a one-line message (without quotes if not ``quote``), cut short."""
  text = cell.encode("latin-1").decode("utf-8", "replace")
  if len(text) > _SHOWN_CHARS:
    text = text[:_SHOWN_CHARS] + "..."
  return repr(text) if quote else repr(text)[1:-1]
