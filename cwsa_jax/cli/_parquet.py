"""Reading a predictions Parquet file in record batches, with pyarrow.

pyarrow is optional (``pip install 'cwsa-jax[parquet]'``) and imported only
when a ``.parquet`` file is read. The file holds the columns of a predictions
CSV (:mod:`cwsa_jax.cli._csv`): ``y_true,y_pred,confidence`` or
``confidence,correct`` (names matched case-insensitively; other columns are
ignored and never read; ``correct`` wins when both sets are present), and the
``--group-by`` column. Only those columns are read, one record batch at a time,
and each batch becomes the :class:`~cwsa_jax.cli._csv.CsvChunk` the CSV reader
yields, so both formats are assembled by the same code into the same arrays.

Column types: ``confidence`` integers, floats or decimals; ``correct``
booleans or 0/1 numbers; the class labels integers (or integral floats), or
strings (class names) in both columns; the group column any scalar type.
Nulls, non-finite confidences and confidences outside [0, 1] (beyond 1e-6)
are refused; messages name the file and the row (counted from 0). A file that
is not Parquet, is truncated or fails to decode is refused naming the file;
page checksums, where the writer stored them, are verified.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from cwsa_jax.cli._csv import (_SPACE, CONFIDENCE_SLACK, CsvChunk, group_column, missing_columns,
                               wanted_columns)
from cwsa_jax.cli._util import UserError

DEFAULT_BATCH_ROWS = 1 << 16
_STREAM_BUFFER = 1 << 20  # bytes read at a time from a column chunk
_MAX_EXACT_LABEL = 2.0 ** 53  # as in the CSV reader: integer labels beyond this are not exact
_SHOWN_ERROR = 200
_NUMBER, _BOOL, _TEXT = "number", "boolean", "string"


def iter_parquet_chunks(path: str | os.PathLike, batch_rows: int = DEFAULT_BATCH_ROWS, *,
                        group_by: str | None = None) -> Iterator[CsvChunk]:
  """Yields the rows of a predictions Parquet file in blocks, parsed and checked.

  Args:
    path: the Parquet file.
    batch_rows: rows per record batch.
    group_by: a column of group labels to return with the rows.

  Yields:
    :class:`~cwsa_jax.cli._csv.CsvChunk` per non-empty batch; its ``first_line``
    and ``last_line`` are the 0-based indices of the batch's first and last row.

  Raises:
    UserError: pyarrow is not installed, or the file cannot be read, is not a
      valid (or is a damaged) Parquet file, lacks a column, has a column of the
      wrong type, holds no rows, or a bad value; the message names the file.
  """
  path = Path(path)
  pa, pq = _pyarrow(path)
  return _read(pa, pq, path, int(batch_rows), group_by)


def _pyarrow(path: Path) -> tuple[Any, Any]:
  """``pyarrow`` and ``pyarrow.parquet``, or a UserError naming the extra that installs them."""
  try:
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415
  except ImportError:
    from cwsa_jax.cli import missing_extra_message  # noqa: PLC0415
    raise UserError(f"{path}: reading Parquet {missing_extra_message('pyarrow')}") from None
  return pa, pq


def _read(pa, pq, path: Path, batch_rows: int, group_by: str | None) -> Iterator[CsvChunk]:
  try:
    handle = open(path, "rb")  # noqa: SIM115
  except OSError as e:
    raise UserError(f"{path}: cannot read: {e.strerror or e}") from None
  with handle:
    try:
      # Streamed column chunks (no pre-buffering of a whole row group): memory stays at about
      # a batch's arrays whatever the row-group size.
      parquet = pq.ParquetFile(handle, pre_buffer=False, buffer_size=_STREAM_BUFFER,
                               page_checksum_verification=True)
      schema = parquet.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as e:
      raise _damaged(path, e) from None
    columns, group = _columns(path, schema, group_by)
    kinds = {name: _check_type(pa, path, name, schema.field(actual))
             for name, actual in {**columns, **({"group": group} if group else {})}.items()}
    label_kind = _label_kind(path, columns, kinds)
    wanted = list(dict.fromkeys([*columns.values(), *([group] if group else [])]))
    rows = 0
    for batch in _batches(pa, path, parquet, wanted, batch_rows):
      if batch.num_rows:
        yield _chunk(pa, path, batch, columns, group, kinds, label_kind, rows)
        rows += batch.num_rows
  if not rows:
    raise UserError(f"{path}: no data rows")


def _batches(pa, path: Path, parquet, columns: list[str], batch_rows: int) -> Iterator[Any]:
  """The record batches of ``columns``; a read error is a UserError naming the file."""
  batches = parquet.iter_batches(batch_size=batch_rows, columns=columns)
  while True:
    try:
      batch = next(batches)
    except StopIteration:
      return
    except (pa.ArrowException, OSError, ValueError) as e:
      raise _damaged(path, e) from None
    yield batch


def _damaged(path: Path, error: Exception) -> UserError:
  text = " ".join(str(error).split()) or type(error).__name__
  if len(text) > _SHOWN_ERROR:
    text = text[:_SHOWN_ERROR] + "..."
  return UserError(f"{path}: not a valid Parquet file, or a damaged or truncated one ({text})")


# --------------------------------------------------------------------------
# Schema: the needed columns and their types
# --------------------------------------------------------------------------


def _columns(path: Path, schema, group_by: str | None) -> tuple[dict[str, str], str | None]:
  """{needed name: the file's column name}, and the file's name of the group column."""
  found = list(schema.names)
  names = [name.strip().lower() for name in found]
  wanted = wanted_columns(names)
  if wanted is None:
    raise missing_columns(path, names, ",".join(found) or "none")
  group_key = group_column(path, names, wanted, group_by, found=",".join(found), where="file")
  columns = {name: found[names.index(name)] for name in wanted}
  return columns, found[names.index(group_key)] if group_key is not None else None


def _type_kind(pa, arrow_type) -> str | None:
  """number, boolean or string (the value type of a dictionary column), else None."""
  if pa.types.is_dictionary(arrow_type):
    arrow_type = arrow_type.value_type
  if (pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)
      or pa.types.is_decimal(arrow_type)):
    return _NUMBER
  if pa.types.is_boolean(arrow_type):
    return _BOOL
  if (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
      or getattr(pa.types, "is_string_view", lambda t: False)(arrow_type)):
    return _TEXT
  return None


_ALLOWED = {"confidence": ((_NUMBER,), "numbers"),
            "correct": ((_NUMBER, _BOOL), "booleans or 0/1 numbers"),
            "y_true": ((_NUMBER, _TEXT), "integer labels or class names (strings)"),
            "y_pred": ((_NUMBER, _TEXT), "integer labels or class names (strings)"),
            "group": ((_NUMBER, _BOOL, _TEXT), "scalar values (numbers, strings or booleans)")}


def _check_type(pa, path: Path, name: str, field) -> str:
  kind = _type_kind(pa, field.type)
  allowed, what = _ALLOWED[name]
  if kind not in allowed:
    raise UserError(f"{path}: column {field.name!r} has type {field.type}; expected {what}")
  return kind


def _label_kind(path: Path, columns: dict[str, str], kinds: dict[str, str]) -> str | None:
  """``"int"`` or ``"name"`` for a file with class labels (both columns alike), else None."""
  if "y_true" not in columns:
    return None
  if kinds["y_true"] != kinds["y_pred"]:
    raise UserError(f"{path}: column {columns['y_true']!r} holds {kinds['y_true']}s but "
                    f"{columns['y_pred']!r} holds {kinds['y_pred']}s: class labels must be all "
                    "integers or all names")
  return "name" if kinds["y_true"] == _TEXT else "int"


# --------------------------------------------------------------------------
# One record batch as NumPy arrays
# --------------------------------------------------------------------------


def _chunk(pa, path: Path, batch, columns: dict[str, str], group: str | None,
           kinds: dict[str, str], label_kind: str | None, offset: int) -> CsvChunk:
  def column(name: str, actual: str):
    array = batch.column(actual)
    if pa.types.is_dictionary(array.type):
      array = array.dictionary_decode()
    _check_no_nulls(path, array, name, offset)
    return array

  conf = _confidences(pa, path, column("confidence", columns["confidence"]), offset)
  y_true = y_pred = groups = None
  if label_kind is None:
    correct = _correct(pa, path, column("correct", columns["correct"]), kinds["correct"], offset)
  else:
    read = _int_labels if label_kind == "int" else _cells
    y_true, y_pred = (read(pa, path, column(name, columns[name]), name, offset)
                      for name in ("y_true", "y_pred"))
    correct = y_true == y_pred
  if group is not None:
    groups = _cells(pa, path, column(group, group), group, offset)
  return CsvChunk(conf, correct, y_true, y_pred, groups, offset, offset + batch.num_rows - 1)


def _check_no_nulls(path: Path, array, name: str, offset: int) -> None:
  if array.null_count:
    i = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
    raise UserError(f"{path}: row {offset + i}: {name} is null (a missing value)")


def _floats(pa, array) -> np.ndarray:
  return np.asarray(array.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False),
                    dtype=np.float64)


def _confidences(pa, path: Path, array, offset: int) -> np.ndarray:
  """float64 confidences in [0, 1] (values within 1e-6 outside clipped), as the CSV reader."""
  values = _floats(pa, array)
  rows = f"rows {offset}-{offset + values.size - 1}"
  bad = np.flatnonzero(~np.isfinite(values))
  if bad.size:
    i = int(bad[0])
    raise UserError(f"{path}: row {offset + i}: confidence {float(values[i])!r} is not a finite "
                    f"number ({bad.size} non-finite value(s) in {rows})")
  bad = np.flatnonzero((values < -CONFIDENCE_SLACK) | (values > 1.0 + CONFIDENCE_SLACK))
  if bad.size:
    i = int(bad[0])
    raise UserError(f"{path}: row {offset + i}: confidence {values[i]:.6g} is outside [0, 1] "
                    f"({bad.size} value(s) out of range in {rows})")
  return np.clip(values, 0.0, 1.0)


def _correct(pa, path: Path, array, kind: str, offset: int) -> np.ndarray:
  if kind == _BOOL:
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=bool)
  values = _floats(pa, array)
  bad = np.flatnonzero((values != 0) & (values != 1))
  if bad.size:
    i = int(bad[0])
    raise UserError(f"{path}: row {offset + i}: correct {values[i]:.6g} must be 0/1 or "
                    "true/false")
  return values == 1


def _int_labels(pa, path: Path, array, name: str, offset: int) -> np.ndarray:
  """int64 labels; like the CSV reader, integral values up to 2**53 in magnitude."""
  values = _floats(pa, array)
  bad = np.flatnonzero(~np.isfinite(values) | (values != np.round(values))
                       | (np.abs(values) > _MAX_EXACT_LABEL))
  if bad.size:
    i = int(bad[0])
    too_large = np.isfinite(values[i]) and values[i] == np.round(values[i])
    raise UserError(f"{path}: row {offset + i}: {name} {values[i]:.17g} is not an integer class "
                    "label" + (" (too large)" if too_large else ""))
  return values.astype(np.int64)


def _distinct(pa, array) -> tuple[list[Any], np.ndarray]:
  """The distinct values of ``array`` and each row's index into them (no Python object per row)."""
  if _type_kind(pa, array.type) == _TEXT and not pa.types.is_string(array.type):
    array = array.cast(pa.large_string())
  encoded = array.dictionary_encode()
  return encoded.dictionary.to_pylist(), encoded.indices.to_numpy(zero_copy_only=False)


def _cells(pa, path: Path, array, name: str, offset: int) -> np.ndarray:
  """Each row's value as text stripped of ASCII whitespace (str [m]), as the CSV reader reads
  class names and group labels; an empty one is refused."""
  values, indices = _distinct(pa, array)
  text = [value.strip(_SPACE) if isinstance(value, str) else str(value) for value in values]
  empty = [i for i, cell in enumerate(text) if cell == ""]
  if empty:
    row = int(np.flatnonzero(indices == empty[0])[0])
    raise UserError(f"{path}: row {offset + row}: empty {name} value")
  return np.asarray(text, dtype=str)[indices]
