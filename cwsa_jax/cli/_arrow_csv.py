"""pyarrow's CSV parser for the CSV reader's arrow path (pyarrow is an optional extra)."""

from __future__ import annotations

import functools


@functools.cache
def modules():
  """``(pyarrow, pyarrow.csv)``, or None: pyarrow is an optional extra, imported on first use."""
  try:
    import pyarrow  # noqa: PLC0415
    import pyarrow.csv  # noqa: PLC0415
  except ImportError:
    return None
  return pyarrow, pyarrow.csv


class ArrowReader:
  """pyarrow's CSV options for one file's layout: its delimiter, no quotes, the needed
  columns only, numbers as float64 and text as raw bytes (dictionary-encoded)."""

  def __init__(self, layout):
    pa, pacsv = modules()
    self._pa, self._pacsv = pa, pacsv
    self.names = [f"f{i}" for i in range(layout.width)]
    self.parse = pacsv.ParseOptions(delimiter=layout.delimiter, quote_char=False,
                                    double_quote=False, escape_char=False,
                                    newlines_in_values=False, ignore_empty_lines=True)
    text = pa.dictionary(pa.int32(), pa.binary())
    self.convert = {}
    for kind in (None, "int", "name"):
      types = {"confidence": pa.float64(), "correct": text,
               "y_true": pa.float64() if kind == "int" else text}
      types["y_pred"] = types["y_true"]
      columns = {self.names[i]: types[name] for name, i in layout.columns.items()}
      if layout.group is not None:
        columns[self.names[layout.group]] = text
      self.convert[kind] = pacsv.ConvertOptions(
          include_columns=list(columns), column_types=columns, null_values=[],
          strings_can_be_null=False, quoted_strings_can_be_null=False, check_utf8=False)

  def read(self, block: bytes, kind: str | None):
    """The block's table, or None where pyarrow refuses it (a cell, a field count)."""
    # One pyarrow block per call; its threaded reader costs less per call than the serial one.
    options = self._pacsv.ReadOptions(column_names=self.names, use_threads=True,
                                      block_size=min(len(block) + 1, 1 << 30))
    try:
      return self._pacsv.read_csv(self._pa.BufferReader(block), read_options=options,
                                  parse_options=self.parse, convert_options=self.convert[kind])
    except self._pa.ArrowException:
      return None
