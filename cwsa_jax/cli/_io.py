"""Reading a model's predictions from disk for ``cwsa-jax evaluate``.

Supported files (chosen by extension):

* ``.csv`` with a header row and either the columns ``y_true,y_pred,confidence``
  (what the paper's published code writes) or ``confidence,correct``. Other
  columns (e.g. a pandas index) are ignored; when both sets are present,
  ``correct`` is used. Class labels are integers or class names (``cat``,
  ``dog``: all one or the other); ``correct`` is 0/1 or true/false. The
  delimiter is ``,``, ``;``, TAB or ``|`` (whichever splits the header into
  those columns). It is read in blocks of rows with NumPy's parser
  (:func:`iter_csv_chunks`, in :mod:`cwsa_jax.cli._csv`).
* ``.parquet`` with the same columns (integer or string labels, boolean or 0/1
  ``correct``), read column-wise in record batches with pyarrow (the optional
  ``parquet`` extra; :mod:`cwsa_jax.cli._parquet`).
* ``.npz`` with ``probs`` [n, K] or ``logits`` [n, K] and ``labels`` [n] (what
  ``cwsa-jax train`` writes), or ``confidences`` [n] and ``correct`` [n].
* ``.npy`` with probabilities or logits [n, K]; the labels come from a second
  ``.npy`` file (``--labels``). Whether the scores are probabilities is decided
  by ``scores=``: ``"auto"`` takes them as probabilities when every value is
  in [0, 1] and every row sums to 1 (within ``PROBABILITY_TOLERANCE``, 1e-3),
  as logits when some value lies outside [0, 1], and refuses values all in
  [0, 1] whose rows do not sum to 1 (neither probabilities nor, most likely,
  logits: ``--scores logits`` reads them as logits). What it chose is stated
  in :attr:`LoadedPredictions.note`.

Confidences must lie in [0, 1]; values within 1e-6 outside (float32 rounding
of a softmax) are clipped. Numbers are read as float64; where some number of
the file (a confidence, a probability, a logit) is not a float32 value, the
float64 confidences are kept beside the float32 ones
(:attr:`LoadedPredictions.wide_confidences`), and the metrics compare them with
thresholds and bin edges, and order them, in float64 (:func:`compared_confidences`).
A file whose numbers are all float32 values is read as float32, as before, and so is a CSV
or Parquet confidence column of float32 values printed with 9 significant digits. Every problem raises
:class:`~cwsa_jax.cli._util.UserError` with a one-line message that starts with
the file name.

Several files (shards) are read as one set of predictions by
:func:`load_inputs`: files, quoted glob patterns and folders (their ``.csv``
and ``.parquet`` files) are expanded by :func:`expand_inputs`, each is read by
:func:`load_predictions`, and the rows are concatenated in order once every
shard is known to hold the same kind of columns (:func:`concatenate`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import zipfile
import zlib
from pathlib import Path
from typing import Iterator, NamedTuple, Sequence

import numpy as np

from cwsa_jax._validation import PROBABILITY_TOLERANCE
from cwsa_jax.cli import _csv, _parquet
from cwsa_jax.cli._csv import iter_csv_chunks
from cwsa_jax.cli._util import UserError

EXTENSIONS = (".csv", ".parquet", ".npz", ".npy")
TABLE_EXTENSIONS = (".csv", ".parquet")  # the files a folder input contributes; --group-by
SCORE_KINDS = ("auto", "probs", "logits")
_CONFIDENCE_SLACK = 1e-6
_PROBS_ATOL = PROBABILITY_TOLERANCE


class LoadedPredictions(NamedTuple):
  """Predictions read from a file.

  Attributes:
    confidences: float32 [n] top-label confidences in [0, 1].
    correct: bool [n].
    source: a short description of what was read (for reports).
    num_classes: number of classes when known (probabilities / logits), else None.
    scores: float64 [n, K] probabilities or logits when the file holds them, else None.
    labels: int64 [n] true labels when the file holds them (scores, or a CSV
      with y_true), else None. For a CSV with class names, ids into
      ``class_names``.
    from_logits: whether ``scores`` are logits.
    groups: int64 [n] group ids in [0, len(group_names)) from ``group_by``, else None.
    group_names: the group labels, in id order (sorted), else None.
    class_names: for a CSV with class names (not integers), the names of the
      label ids (the sorted names seen in y_true and y_pred), else None.
    note: one line for stderr on how the file was read where the reader chose
      (a ``.npy`` score matrix under ``scores="auto"``: probabilities or logits),
      else None.
    wide_confidences: float64 [n] confidences where some number the file holds for them
      (confidences, probabilities or logits) is not a float32 value, else None: the
      metrics then compare and order these (:func:`compared_confidences`).
  """
  confidences: np.ndarray
  correct: np.ndarray
  source: str
  num_classes: int | None = None
  scores: np.ndarray | None = None
  labels: np.ndarray | None = None
  from_logits: bool = False
  groups: np.ndarray | None = None
  group_names: tuple[str, ...] | None = None
  class_names: tuple[str, ...] | None = None
  note: str | None = None
  wide_confidences: np.ndarray | None = None


def compared_confidences(loaded: LoadedPredictions) -> np.ndarray:
  """The confidences [n] the metrics compare with thresholds and bin edges and order: float64
  where the file's numbers are not all float32 values (``wide_confidences``), else float32."""
  return loaded.confidences if loaded.wide_confidences is None else loaded.wide_confidences


def _float32_values(values: np.ndarray) -> bool:
  """Whether every float64 value is a float32 value (the file is then read as float32)."""
  return bool(np.array_equal(values.astype(np.float32), values))


def float32_printed(values: np.ndarray) -> bool:
  """Whether every float64 value read from text is a float32 value or that float32 printed with
  9 significant digits (``%.9g``, which round-trips float32): a float32 dump, read as float32."""
  f = values.astype(np.float32).astype(np.float64)
  with np.errstate(divide="ignore", invalid="ignore"):
    digits = 8 - np.floor(np.log10(np.abs(f)))
    exact_scale = (digits >= 0) & (digits <= 22)  # 10**digits is a float64 value
    scale = 10.0 ** np.where(exact_scale, digits, 0)
    printed = np.where(exact_scale, np.round(f * scale) / scale, f)
  return bool(np.all((values == f) | (values == printed)))


def _with_float64(confidences: np.ndarray, numbers: np.ndarray) -> np.ndarray | None:
  """float64 ``confidences`` where some of the file's ``numbers`` is not a float32 value."""
  return None if _float32_values(numbers) else confidences.astype(np.float64, copy=False)


def load_predictions(path: str | os.PathLike, *, labels_path: str | os.PathLike | None = None,
                     scores: str = "auto", group_by: str | None = None) -> LoadedPredictions:
  """Reads (confidences, correct) from a CSV, Parquet, ``.npz`` or ``.npy`` file.

  Args:
    path: the predictions file.
    labels_path: for ``.npy`` scores, the ``.npy`` file with the integer labels.
    scores: ``"auto"``, ``"probs"`` or ``"logits"``: how to read a score matrix.
    group_by: for a CSV or Parquet file, a column of group labels (integers, or
      strings mapped to ids in sorted order).

  Returns:
    :class:`LoadedPredictions`.

  Raises:
    UserError: the file is missing, unreadable, has an unknown extension, lacks
      columns or keys, holds non-numeric or non-finite values, confidences
      outside [0, 1], labels out of range, or arrays of different lengths.
  """
  if scores not in SCORE_KINDS:
    raise UserError(f"--scores must be one of {', '.join(SCORE_KINDS)}, got {scores!r}")
  path = Path(path)
  ext = _checked_extension(path)
  if labels_path is not None and ext != ".npy":
    raise UserError(f"--labels is only used with a .npy scores file, not with {path}")
  if group_by is not None and ext not in TABLE_EXTENSIONS:
    raise UserError(f"--group-by needs a CSV or Parquet file with the group column, not {path}")
  with _one_line_errors():
    if ext in TABLE_EXTENSIONS:
      return _load_table(path, _table_chunks(path, ext, None, group_by))
    if ext == ".npz":
      return _load_npz(path, scores)
    return _load_npy(path, labels_path, scores)


def _checked_extension(path: Path) -> str:
  """The lower-case extension of an existing input file (UserError naming it otherwise)."""
  ext = path.suffix.lower()
  if ext not in EXTENSIONS:
    raise UserError(f"{path}: unknown file type {path.suffix or '(no extension)'!r}; "
                    f"expected one of {', '.join(EXTENSIONS)}")
  if not path.exists():
    raise UserError(f"{path}: file not found")
  if path.is_dir():
    raise UserError(f"{path}: is a directory, expected a {ext} file")
  return ext


@contextlib.contextmanager
def _one_line_errors() -> Iterator[None]:
  """Re-raises a UserError whose message spans several lines (NumPy's) as one line."""
  try:
    yield
  except UserError as e:
    message = str(e)
    if "\n" not in message and "\r" not in message:
      raise
    raise UserError(" ".join(message.split())) from None


_TABLE_KINDS = {".csv": "CSV", ".parquet": "Parquet"}


def _table_chunks(path: Path, ext: str, chunk_rows: int | None,
                  group_by: str | None) -> Iterator[_csv.CsvChunk]:
  """The checked blocks of a CSV or Parquet file (``chunk_rows`` rows at most; None: the
  reader's default)."""
  if ext == ".csv":
    return iter_csv_chunks(path, chunk_rows or _csv.DEFAULT_CHUNK_ROWS, group_by=group_by)
  return _parquet.iter_parquet_chunks(path, chunk_rows or _parquet.DEFAULT_BATCH_ROWS,
                                      group_by=group_by)


def iter_table_chunks(path: str | os.PathLike, chunk_rows: int) -> Iterator[_csv.CsvChunk]:
  """The blocks of ``chunk_rows`` rows at most of a CSV or Parquet predictions file, read
  one at a time (``evaluate --stream``), checked as :func:`load_predictions` checks them.

  Raises:
    UserError: as :func:`load_predictions` (one line naming the file), or the file is not
      a CSV or Parquet file.
  """
  path = Path(path)
  ext = _checked_extension(path)
  if ext not in TABLE_EXTENSIONS:
    raise UserError(f"{path}: --stream reads CSV and Parquet files only; a {ext} file is "
                    "loaded whole: drop --stream")
  with _one_line_errors():
    yield from _table_chunks(path, ext, chunk_rows, None)


def chunk_labels(chunk: _csv.CsvChunk) -> str | None:
  """The class labels of a file's block: None (``confidence, correct``), ``"int"`` or
  ``"name"`` (class names)."""
  if chunk.y_true is None:
    return None
  return "name" if chunk.y_true.dtype.kind == "U" else "int"


def table_schema(labels: str | None) -> str:
  """What a CSV or Parquet file with ``labels`` (:func:`chunk_labels`) holds, in words."""
  if labels is None:
    return "confidence, correct"
  return f"y_true, y_pred, confidence ({'class names' if labels == 'name' else 'integer labels'})"


def table_source(paths: Sequence[Path], labels: str | None) -> str:
  """The ``source`` of CSV or Parquet predictions (as :func:`load_inputs` states it)."""
  if len(paths) > 1:
    return f"{inputs_name(paths)}: {table_schema(labels)}"
  path = Path(paths[0])
  columns = ("confidence, correct" if labels is None else
             "y_true, y_pred, confidence" + ("; class names" if labels == "name" else ""))
  return f"{path.name} ({_TABLE_KINDS[path.suffix.lower()]}: {columns})"


def different_columns(path: Path, schema: str, first: Path, first_schema: str) -> UserError:
  """The error of a shard whose columns differ from the first's."""
  return UserError(f"{path}: holds {schema} but {first} holds {first_schema}; every input "
                   "must have the same columns")


# --------------------------------------------------------------------------
# Several inputs (shards) as one set of predictions
# --------------------------------------------------------------------------


def expand_inputs(specs: Sequence[str | os.PathLike]) -> list[Path]:
  """The input files ``specs`` name, in the order given.

  A path that exists is taken as is; a folder stands for its ``.csv`` and
  ``.parquet`` files (sorted by name; hidden files left out). A path that does
  not exist and holds ``*``, ``?`` or ``[`` is a glob pattern: its matching
  files, sorted (``**`` also matches sub-folders). Any other path is kept, to
  be reported missing when it is read.

  Raises:
    UserError: no inputs, a folder without such files, a pattern that matches
      no file, or one file named twice.
  """
  files = []
  for spec in specs:
    raw = os.fspath(spec)
    if os.path.isdir(raw):
      files.extend(_folder_files(raw))
    elif not os.path.lexists(raw) and any(c in raw for c in "*?["):
      matches = [Path(m) for m in sorted(glob.glob(raw, recursive=True)) if not os.path.isdir(m)]
      if not matches:
        raise UserError(f"{raw}: no file matches this pattern")
      files.extend(matches)
    else:
      files.append(Path(raw))
  if not files:
    raise UserError("no input files given")
  seen = {}
  for path in files:
    key = os.path.realpath(path)
    if key in seen:
      raise UserError(f"{path}: named twice (also as {seen[key]}); each input is read once")
    seen[key] = path
  return files


def _folder_files(raw: str) -> list[Path]:
  try:
    found = sorted(p for p in Path(raw).iterdir()
                   if p.suffix.lower() in TABLE_EXTENSIONS and not p.name.startswith(".")
                   and p.is_file())
  except OSError as e:
    raise UserError(f"{raw}: cannot read the folder: {e.strerror or e}") from None
  if not found:
    raise UserError(f"{raw}: the folder holds no {' or '.join(TABLE_EXTENSIONS)} files")
  return found


def load_inputs(paths: Sequence[str | os.PathLike], *,
                labels_path: str | os.PathLike | None = None, scores: str = "auto",
                group_by: str | None = None) -> LoadedPredictions:
  """Reads every file of ``paths`` (from :func:`expand_inputs`) as one set of predictions.

  One file is read by :func:`load_predictions`. The rows of several are
  concatenated in order (:func:`concatenate`); they must hold the same kind of
  predictions: the same columns (confidence and correct, or integer labels, or
  class names), the same number of classes and probs or logits for ``.npz``,
  and the ``group_by`` column. ``labels_path`` goes with a single ``.npy`` file.

  Raises:
    UserError: no paths, ``labels_path`` with several, a file
      :func:`load_predictions` refuses, or two files of different kinds; the
      message names the file.
  """
  paths = [Path(p) for p in paths]
  if not paths:
    raise UserError("no input files given")
  if len(paths) == 1:
    return load_predictions(paths[0], labels_path=labels_path, scores=scores, group_by=group_by)
  if labels_path is not None:
    raise UserError("--labels goes with a single .npy scores file, not with several inputs; "
                    "for shards with scores use .npz files (probs or logits, and labels)")
  parts = []
  for path in paths:
    loaded = load_predictions(path, scores=scores, group_by=group_by)
    if parts and _schema(loaded) != _schema(parts[0]):
      raise different_columns(path, _schema(loaded), paths[0], _schema(parts[0]))
    parts.append(loaded)
  return concatenate(parts, paths)


def inputs_name(paths: Sequence[Path]) -> str:
  """The input files' names for titles: all of up to three, else the first and last and a count."""
  names = [Path(p).name for p in paths]
  if len(names) <= 3:
    return ", ".join(names)
  return f"{names[0]}, ..., {names[-1]} ({len(names)} files)"


def _schema(loaded: LoadedPredictions) -> str:
  """What kind of predictions a file holds, in words (equal for files that can be joined)."""
  if loaded.scores is not None:
    kind = "logits" if loaded.from_logits else "probs"
    return f"{kind} over {loaded.num_classes} classes and labels"
  if loaded.labels is not None:
    return table_schema("name" if loaded.class_names is not None else "int")
  return table_schema(None)


def concatenate(parts: Sequence[LoadedPredictions], paths: Sequence[Path]) -> LoadedPredictions:
  """The rows of ``parts`` (alike: see :func:`load_inputs`) in order, as one set.

  Class names and group labels are merged into the sorted union of every
  part's, as if the rows had been read from one file.
  """
  first = parts[0]
  labels = class_names = groups = group_names = scores = None
  if first.class_names is not None:
    labels, names = _merge_codes([(np.asarray(p.class_names, dtype=str), p.labels) for p in parts])
    class_names = tuple(str(name) for name in names)
  elif first.labels is not None:
    labels = np.concatenate([p.labels for p in parts])
  if first.groups is not None:
    groups, group_names = _group_ids([(np.asarray(p.group_names, dtype=str), p.groups)
                                      for p in parts])
  if first.scores is not None:
    scores = np.concatenate([p.scores for p in parts])
  source = f"{inputs_name(paths)}: {_schema(first)}"  # == table_source for CSV / Parquet
  wide = None
  if any(p.wide_confidences is not None for p in parts):  # float64 for the whole set
    wide = np.concatenate([compared_confidences(p).astype(np.float64) for p in parts])
  return LoadedPredictions(np.concatenate([p.confidences for p in parts]),
                           np.concatenate([p.correct for p in parts]), source,
                           num_classes=first.num_classes, scores=scores, labels=labels,
                           from_logits=first.from_logits, groups=groups,
                           group_names=group_names, class_names=class_names,
                           wide_confidences=wide)


# --------------------------------------------------------------------------
# CSV and Parquet
# --------------------------------------------------------------------------


def _load_table(path: Path, chunks: Iterator[_csv.CsvChunk]) -> LoadedPredictions:
  """The blocks of a CSV or Parquet file as one set: only NumPy arrays are kept."""
  confidences, wide, printed = [], [], True  # float32 and float64 blocks; all float32 dumps?
  correct, true_labels, pred_names, groups = [], [], [], []
  for chunk in chunks:
    wide.append(np.asarray(chunk.confidences, np.float64))
    confidences.append(wide[-1].astype(np.float32))
    printed = printed and float32_printed(wide[-1])  # per block: bounded temporaries
    correct.append(chunk.correct)
    if chunk.y_true is not None:
      if chunk.y_true.dtype.kind == "U":
        true_labels.append(np.unique(chunk.y_true, return_inverse=True))
        pred_names.append(np.unique(chunk.y_pred))
      else:
        true_labels.append(chunk.y_true)
    if chunk.groups is not None:
      groups.append(np.unique(chunk.groups, return_inverse=True))
  labels = class_names = None
  if not true_labels:
    source = table_source([path], None)
  elif isinstance(true_labels[0], tuple):
    labels, names = _merge_codes(true_labels, pred_names)
    class_names = tuple(str(name) for name in names)
    source = table_source([path], "name")
  else:
    labels = np.concatenate(true_labels)
    source = table_source([path], "int")
  group_ids = group_names = None
  if groups:
    group_ids, group_names = _group_ids(groups)
  return LoadedPredictions(np.concatenate(confidences), np.concatenate(correct), source,
                           labels=labels, groups=group_ids, group_names=group_names,
                           class_names=class_names,
                           wide_confidences=None if printed else np.concatenate(wide))


def _merge_codes(parts: list[tuple[np.ndarray, np.ndarray]],
                 extra: list[np.ndarray] = ()) -> tuple[np.ndarray, np.ndarray]:
  """Blocks of (unique values, inverse) as int64 ids into the sorted union (with ``extra``)."""
  union = np.unique(np.concatenate([u for u, _ in parts] + list(extra)))
  ids = [np.searchsorted(union, u)[inverse] for u, inverse in parts]
  return np.concatenate(ids).astype(np.int64), union


def _group_ids(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, tuple[str, ...]]:
  """Group ids in sorted label order: integer labels numerically, else strings."""
  ids, cells = _merge_codes(parts)
  try:
    values = np.array([int(cell) for cell in cells.tolist()], dtype=np.int64)
  except (ValueError, OverflowError):
    return ids, tuple(str(cell) for cell in cells.tolist())
  unique, remap = np.unique(values, return_inverse=True)
  return remap[ids].astype(np.int64), tuple(str(int(u)) for u in unique)


def class_groups(loaded: LoadedPredictions) -> tuple[np.ndarray, tuple[str, ...]]:
  """Group ids of the true classes (sorted) and their names (class names when the file has them)."""
  unique, ids = np.unique(loaded.labels, return_inverse=True)
  names = loaded.class_names
  return ids.astype(np.int64), tuple(names[int(u)] if names is not None else str(int(u))
                                     for u in unique)


def label_values(loaded: LoadedPredictions) -> np.ndarray | None:
  """The true labels as the file wrote them (int64, or str class names), else None."""
  if loaded.labels is None:
    return None
  if loaded.class_names is None:
    return loaded.labels
  return np.asarray(loaded.class_names, dtype=str)[loaded.labels]


def _check_confidences(path: Path, values: np.ndarray, name: str,
                       lines: list[int] | None = None) -> np.ndarray:
  bad = np.flatnonzero((values < -_CONFIDENCE_SLACK) | (values > 1.0 + _CONFIDENCE_SLACK))
  if bad.size:
    i = int(bad[0])
    where = f"line {lines[i]}: " if lines is not None else f"entry {i}: "
    raise UserError(f"{path}: {where}{name} {values[i]:.6g} is outside [0, 1] "
                    f"({bad.size} value(s) out of range)")
  return np.clip(values, 0.0, 1.0)


# --------------------------------------------------------------------------
# NumPy files
# --------------------------------------------------------------------------


def _load_array(path: Path, data: np.ndarray | None = None) -> np.ndarray:
  if data is not None:
    return data
  try:
    array = np.load(path, allow_pickle=False)
  except (ValueError, EOFError) as e:
    raise UserError(f"{path}: cannot read as .npy ({e})") from None
  except OSError as e:
    raise UserError(f"{path}: cannot read: {e}") from None
  if not isinstance(array, np.ndarray):
    array.close()
    raise UserError(f"{path}: an .npz archive, not a .npy array (rename it to .npz?)")
  return array


def _load_npz(path: Path, scores: str) -> LoadedPredictions:
  try:
    archive = np.load(path, allow_pickle=False)
  except (zipfile.BadZipFile, ValueError, EOFError) as e:
    raise UserError(f"{path}: not a valid .npz file ({e})") from None
  except OSError as e:
    raise UserError(f"{path}: cannot read: {e}") from None
  if not isinstance(archive, np.lib.npyio.NpzFile):
    raise UserError(f"{path}: not an .npz archive (it holds a single array; rename it to .npy?)")
  with archive:
    files = set(archive.files)
    keys = ", ".join(sorted(files)) or "none"
    if "confidences" in files and "correct" in files:
      conf, correct = (_npz_member(path, archive, k) for k in ("confidences", "correct"))
      return _from_confidences(path, conf, correct)
    have = [k for k in ("probs", "logits") if k in files]
    if not have or "labels" not in files:
      raise UserError(f"{path}: expected the keys probs (or logits) and labels, or confidences "
                      f"and correct; found {keys}")
    if len(have) == 2:
      kind = "probs" if scores in ("auto", "probs") else "logits"
    else:
      kind = have[0]
      if scores != "auto" and scores != kind:
        raise UserError(f"{path}: --scores {scores} given but the file holds {kind}")
    values, labels = (_npz_member(path, archive, k) for k in (kind, "labels"))
  return _from_scores(path, values, path, labels, kind, f"{path.name} (npz: {kind}, labels)")


def _npz_member(path: Path, archive, key: str) -> np.ndarray:
  """One array of an archive (only the needed ones are read: others may hold anything)."""
  try:
    value = archive[key]
  except (zipfile.BadZipFile, ValueError, EOFError, KeyError, NotImplementedError, RuntimeError,
          zlib.error) as e:
    raise UserError(f"{path}: cannot read {key} ({e})") from None
  except OSError as e:
    raise UserError(f"{path}: cannot read {key}: {e}") from None
  if not isinstance(value, np.ndarray):
    raise UserError(f"{path}: member {key!r} is not a .npy array")
  return value


def _from_confidences(path: Path, confidences: np.ndarray,
                      correct: np.ndarray) -> LoadedPredictions:
  conf = _numeric(path, confidences, "confidences")
  if conf.ndim != 1:
    raise UserError(f"{path}: confidences must be 1-D [n], got shape {conf.shape}")
  if conf.size == 0:
    raise UserError(f"{path}: confidences is empty")
  correct = _as_bool(path, correct, "correct")
  if correct.ndim != 1:
    raise UserError(f"{path}: correct must be 1-D [n], got shape {correct.shape}")
  if correct.shape != conf.shape:
    raise UserError(f"{path}: confidences has {conf.shape[0]} entries but correct has "
                    f"{correct.shape[0]}")
  conf = _check_confidences(path, conf, "confidences")
  return LoadedPredictions(conf.astype(np.float32), correct,
                           f"{path.name} (npz: confidences, correct)",
                           wide_confidences=_with_float64(conf, conf))


def _load_npy(path: Path, labels_path, scores: str) -> LoadedPredictions:
  if labels_path is None:
    raise UserError(f"{path}: a .npy file holds only the scores; pass the labels with "
                    "--labels LABELS.npy (or use an .npz with probs and labels)")
  labels_path = Path(labels_path)
  if labels_path.suffix.lower() != ".npy":
    raise UserError(f"{labels_path}: --labels must be a .npy file")
  if not labels_path.exists():
    raise UserError(f"{labels_path}: file not found")
  values = _load_array(path)
  labels = _load_array(labels_path)
  values = _numeric(path, values, "scores")
  kind, reason = (_auto_kind(path, values) if scores == "auto" else (scores, None))
  loaded = _from_scores(path, values, labels_path, labels, kind,
                        f"{path.name} ({kind}) + {labels_path.name} (labels)")
  if reason is None:
    return loaded
  words = "logits" if kind == "logits" else "probabilities"
  return loaded._replace(note=f"{path.name}: scores read as {words} (--scores auto: {reason})")


def _auto_kind(path: Path, values: np.ndarray) -> tuple[str, str]:
  """``--scores auto`` on a ``.npy`` matrix: ("probs" or "logits", why).

  Raises:
    UserError: every value lies in [0, 1] but a row does not sum to 1: not
      probabilities, and unlikely to be logits (``--scores logits`` if they are).
  """
  if values.ndim != 2 or values.size == 0:
    return "probs", "no score matrix"  # _from_scores reports the shape problem
  if values.min() < -_CONFIDENCE_SLACK or values.max() > 1.0 + _CONFIDENCE_SLACK:
    return "logits", "values outside [0, 1]"
  err = np.abs(values.sum(axis=1) - 1.0)
  if err.max() > _PROBS_ATOL:
    row = int(np.argmax(err))
    raise UserError(f"{path}: scores lie in [0, 1] but are not probabilities: row {row} sums to "
                    f"{values[row].sum():.6g}, not 1 (tolerance {_PROBS_ATOL:g}); "
                    "if they are logits, use --scores logits")
  return "probs", "values in [0, 1], rows sum to 1"


def _numeric(path: Path, array: np.ndarray, name: str) -> np.ndarray:
  if array.dtype == bool or not (np.issubdtype(array.dtype, np.floating)
                                 or np.issubdtype(array.dtype, np.integer)):
    raise UserError(f"{path}: {name} must be numeric, got dtype {array.dtype}")
  array = array.astype(np.float64)
  if not np.all(np.isfinite(array)):
    raise UserError(f"{path}: {name} contains {int(np.sum(~np.isfinite(array)))} NaN or infinite value(s)")
  return array


def _as_bool(path: Path, array: np.ndarray, name: str) -> np.ndarray:
  if array.dtype == bool:
    return array
  values = _numeric(path, array, name)
  if not np.all((values == 0) | (values == 1)):
    raise UserError(f"{path}: {name} must be boolean or 0/1")
  return values == 1


def _from_scores(path: Path, scores: np.ndarray, labels_path: Path, labels: np.ndarray, kind: str,
                 source: str) -> LoadedPredictions:
  scores = _numeric(path, scores, kind)
  if scores.ndim != 2:
    raise UserError(f"{path}: {kind} must have shape [n, num_classes], got {scores.shape}")
  n, num_classes = scores.shape
  if n == 0 or num_classes == 0:
    raise UserError(f"{path}: {kind} is empty (shape {scores.shape})")
  if labels.ndim != 1:
    raise UserError(f"{labels_path}: labels must be 1-D [n], got shape {labels.shape}")
  if labels.shape[0] != n:
    raise UserError(f"{path}: {kind} has {n} rows but the labels have {labels.shape[0]}")
  labels = _numeric(labels_path, labels, "labels")
  if not np.all(labels == np.round(labels)):
    raise UserError(f"{labels_path}: labels must be integer class indices")
  if labels.min() < 0 or labels.max() >= num_classes:
    raise UserError(f"{labels_path}: labels must lie in [0, {num_classes}), got values in "
                    f"[{int(labels.min())}, {int(labels.max())}]")
  labels = labels.astype(np.int64)
  if kind == "probs":
    if scores.min() < -_CONFIDENCE_SLACK or scores.max() > 1.0 + _CONFIDENCE_SLACK:
      raise UserError(f"{path}: probs must lie in [0, 1], got values in "
                      f"[{scores.min():.6g}, {scores.max():.6g}] (logits? use --scores logits)")
    err = np.abs(scores.sum(axis=1) - 1.0)
    if err.max() > _PROBS_ATOL:
      row = int(np.argmax(err))
      raise UserError(f"{path}: probs rows must sum to 1; row {row} sums to "
                      f"{scores[row].sum():.6g} (logits? use --scores logits)")
    confidences = np.clip(scores.max(axis=1), 0.0, 1.0)
  else:
    shifted = scores - scores.max(axis=1, keepdims=True)
    confidences = 1.0 / np.exp(shifted).sum(axis=1)
  correct = scores.argmax(axis=1) == labels
  return LoadedPredictions(confidences.astype(np.float32), correct, source, num_classes,
                           scores, labels, kind == "logits",
                           wide_confidences=_with_float64(confidences, scores))


# --------------------------------------------------------------------------
# Real-valued scores (evaluate --scores real)
# --------------------------------------------------------------------------

REAL_SCORES = "real"  # evaluate's --scores choice for real-valued score columns
SCORE_COLUMNS = ("score", "confidence")  # the column read as the score, the first present
_DELIMITERS = (",", ";", "\t", "|")


class RealScores(NamedTuple):
  """Real-valued scores (a logit, a negative energy: higher means more likely correct).

  Attributes:
    scores: float64 [n], any finite values.
    correct: bool [n].
    source: a short description of what was read (for reports).
  """
  scores: np.ndarray
  correct: np.ndarray
  source: str


def load_real_scores(paths: Sequence[str | os.PathLike]) -> RealScores:
  """Reads real-valued scores and correctness from CSV or ``.npz`` files (rows concatenated).

  A CSV has a header naming a ``score`` column (else ``confidence``) and ``correct`` (0/1,
  true/false) or ``y_true`` and ``y_pred``; an ``.npz`` holds ``scores`` (or
  ``confidences``) [n] and ``correct`` [n]. Scores are read as float64 and need only be finite.

  Raises:
    UserError: a missing or unreadable file, another file type, a missing column or key, a
      score that is not a finite number, correctness other than 0/1; one line naming the file.
  """
  parts = []
  for path in (Path(p) for p in paths):
    ext = _checked_extension(path)
    if ext == ".csv":
      parts.append(_real_csv(path))
    elif ext == ".npz":
      parts.append(_real_npz(path))
    else:
      raise UserError(f"{path}: --scores real reads .csv and .npz files (a score column or "
                      f"array and correctness), not {ext} files")
  scores = np.concatenate([p[0] for p in parts])
  correct = np.concatenate([p[1] for p in parts])
  source = (f"{inputs_name(paths)}: real-valued scores, correct" if len(parts) > 1 else
            f"{Path(paths[0]).name} (real-valued scores, correct)")
  return RealScores(scores, correct, source)


def _real_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
  try:
    archive = np.load(path, allow_pickle=False)
  except (zipfile.BadZipFile, ValueError, EOFError, OSError) as e:
    raise UserError(f"{path}: not a valid .npz file ({e})") from None
  if not isinstance(archive, np.lib.npyio.NpzFile):
    raise UserError(f"{path}: not an .npz archive (it holds a single array)")
  with archive:
    name = next((k for k in ("scores", "confidences") if k in archive.files), None)
    if name is None or "correct" not in archive.files:
      raise UserError(f"{path}: --scores real expects the keys scores (or confidences) and "
                      f"correct; found {', '.join(sorted(archive.files)) or 'none'}")
    scores = _numeric(path, _npz_member(path, archive, name), name)
    correct = _as_bool(path, _npz_member(path, archive, "correct"), "correct")
  if scores.ndim != 1 or scores.size == 0 or correct.shape != scores.shape:
    raise UserError(f"{path}: {name} and correct must be non-empty 1-D arrays of the same "
                    f"length, got shapes {scores.shape} and {correct.shape}")
  return scores, correct


_TRUE_CELLS = {"1", "1.0", "true", "t", "yes"}
_FALSE_CELLS = {"0", "0.0", "false", "f", "no"}


def _real_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
  import csv  # only this reader needs it
  try:
    with open(path, newline="", encoding="utf-8-sig") as f:
      lines = list(csv.reader(f, delimiter=_real_delimiter(path, f)))
  except (OSError, UnicodeDecodeError, csv.Error) as e:
    raise UserError(f"{path}: cannot read: {e}") from None
  header = [cell.strip().lower() for cell in lines[0]]
  score = next((header.index(c) for c in SCORE_COLUMNS if c in header), None)
  has_labels = "y_true" in header and "y_pred" in header
  if score is None or ("correct" not in header and not has_labels):
    raise UserError(f"{path}: --scores real needs a header with score (or confidence) and "
                    f"correct (or y_true and y_pred) columns, found {','.join(header)}")
  columns = ([header.index("correct")] if "correct" in header else
             [header.index("y_true"), header.index("y_pred")])
  scores, correct = [], []
  for number, row in enumerate(lines[1:], start=2):
    if not any(cell.strip() for cell in row):
      continue  # blank line
    if len(row) <= max(score, *columns):
      raise UserError(f"{path}: line {number}: {len(row)} cells, the header has {len(header)}")
    cell = row[score].strip()
    try:
      value = float(cell)
    except ValueError:
      value = float("nan")
    if not np.isfinite(value):
      raise UserError(f"{path}: line {number}: score {cell[:60]!r} is not a finite number")
    scores.append(value)
    correct.append(_real_correct(path, number, [row[j].strip() for j in columns]))
  if not scores:
    raise UserError(f"{path}: no data rows")
  return np.asarray(scores, np.float64), np.asarray(correct, bool)


def _real_delimiter(path: Path, f) -> str:
  """The first delimiter that splits the header into more than one cell."""
  first = f.readline()
  f.seek(0)
  for delimiter in _DELIMITERS:
    if delimiter in first:
      return delimiter
  raise UserError(f"{path}: the header has no , ; TAB or | delimiter")


def _real_correct(path: Path, number: int, cells: list[str]) -> bool:
  if len(cells) == 2:  # y_true, y_pred: equal labels (numbers compared as numbers)
    try:
      return float(cells[0]) == float(cells[1])
    except ValueError:
      return cells[0] == cells[1]
  value = cells[0].lower()
  if value in _TRUE_CELLS or value in _FALSE_CELLS:
    return value in _TRUE_CELLS
  raise UserError(f"{path}: line {number}: correct {cells[0][:60]!r} is not 0/1 or true/false")
