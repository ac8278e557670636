"""Reading a model's predictions from disk for ``cwsa-jax evaluate``.

Supported files (chosen by extension):

* ``.csv`` with a header row and either the columns ``y_true,y_pred,confidence``
  (what the paper's published code writes) or ``confidence,correct``. Other
  columns (e.g. a pandas index) are ignored; when both sets are present,
  ``correct`` is used. Labels must be integers; ``correct`` is 0/1 or
  true/false.
* ``.npz`` with ``probs`` [n, K] or ``logits`` [n, K] and ``labels`` [n] (what
  ``cwsa-jax train`` writes), or ``confidences`` [n] and ``correct`` [n].
* ``.npy`` with probabilities or logits [n, K]; the labels come from a second
  ``.npy`` file (``--labels``). Whether the scores are probabilities is decided
  by ``scores=``: ``"auto"`` takes them as probabilities when every value is
  in [0, 1] and every row sums to 1 (within 1e-3), else as logits.

Confidences must lie in [0, 1]; values within 1e-6 outside (float32 rounding
of a softmax) are clipped. Every problem raises
:class:`~cwsa_jax._cli_util.UserError` with a one-line message that starts with
the file name.
"""

from __future__ import annotations

import csv
import os
import zipfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

from cwsa_jax._cli_util import UserError

EXTENSIONS = (".csv", ".npz", ".npy")
SCORE_KINDS = ("auto", "probs", "logits")
_CONFIDENCE_SLACK = 1e-6
_PROBS_ATOL = 1e-3
_TRUE = {"1", "1.0", "true", "t", "yes"}
_FALSE = {"0", "0.0", "false", "f", "no"}


class LoadedPredictions(NamedTuple):
  """Predictions read from a file.

  Attributes:
    confidences: float32 [n] top-label confidences in [0, 1].
    correct: bool [n].
    source: a short description of what was read (for reports).
    num_classes: number of classes when known (probabilities / logits), else None.
    scores: float64 [n, K] probabilities or logits when the file holds them, else None.
    labels: int64 [n] true labels when the file holds them (scores, or a CSV
      with y_true), else None.
    from_logits: whether ``scores`` are logits.
    groups: int64 [n] group ids in [0, len(group_names)) from ``group_by``, else None.
    group_names: the group labels, in id order (sorted), else None.
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


def load_predictions(path: str | os.PathLike, *, labels_path: str | os.PathLike | None = None,
                     scores: str = "auto", group_by: str | None = None) -> LoadedPredictions:
  """Reads (confidences, correct) from a CSV, ``.npz`` or ``.npy`` file.

  Args:
    path: the predictions file.
    labels_path: for ``.npy`` scores, the ``.npy`` file with the integer labels.
    scores: ``"auto"``, ``"probs"`` or ``"logits"``: how to read a score matrix.
    group_by: for a CSV, a column of group labels (integers, or strings mapped
      to ids in sorted order).

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
  ext = path.suffix.lower()
  if ext not in EXTENSIONS:
    raise UserError(f"{path}: unknown file type {path.suffix or '(no extension)'!r}; "
                    f"expected one of {', '.join(EXTENSIONS)}")
  if not path.exists():
    raise UserError(f"{path}: file not found")
  if path.is_dir():
    raise UserError(f"{path}: is a directory, expected a {ext} file")
  if labels_path is not None and ext != ".npy":
    raise UserError(f"--labels is only used with a .npy scores file, not with {path}")
  if group_by is not None and ext != ".csv":
    raise UserError(f"--group-by needs a CSV file with the group column, not {path}")
  if ext == ".csv":
    return _load_csv(path, group_by)
  if ext == ".npz":
    return _load_npz(path, scores)
  return _load_npy(path, labels_path, scores)


# --------------------------------------------------------------------------
# CSV
# --------------------------------------------------------------------------


def _load_csv(path: Path, group_by: str | None = None) -> LoadedPredictions:
  try:
    with open(path, newline="", encoding="utf-8-sig") as f:
      rows = list(csv.reader(f))
  except UnicodeDecodeError:
    raise UserError(f"{path}: not a text CSV file (cannot decode it as UTF-8)") from None
  except (OSError, csv.Error) as e:
    raise UserError(f"{path}: cannot read CSV: {e}") from None
  # Skip blank lines but remember the line numbers (header is line 1).
  numbered = [(i + 1, row) for i, row in enumerate(rows) if any(cell.strip() for cell in row)]
  if not numbered:
    raise UserError(f"{path}: empty file (expected a header with y_true,y_pred,confidence "
                    "or confidence,correct)")
  _, header = numbered[0]
  names = [h.strip().lower() for h in header]
  index = {}
  for i, name in enumerate(names):
    if name and name in index:
      raise UserError(f"{path}: duplicate column {name!r} in the header")
    index[name] = i
  if "confidence" in index and "correct" in index:
    wanted = ("confidence", "correct")
  elif {"y_true", "y_pred", "confidence"} <= set(index):
    wanted = ("y_true", "y_pred", "confidence")
  else:
    missing_a = [c for c in ("y_true", "y_pred", "confidence") if c not in index]
    missing_b = [c for c in ("confidence", "correct") if c not in index]
    missing = missing_a if len(missing_a) <= len(missing_b) else missing_b
    found = ",".join(h.strip() for h in header)
    raise UserError(f"{path}: missing column(s) {', '.join(missing)}; expected the columns "
                    f"y_true,y_pred,confidence or confidence,correct, found {found}")
  group_key = None
  if group_by is not None:
    group_key = group_by.strip().lower()
    if group_key not in index or not group_key:
      found = ",".join(h.strip() for h in header)
      raise UserError(f"{path}: --group-by column {group_by!r} not found; the header has {found}")
  data = numbered[1:]
  if not data:
    raise UserError(f"{path}: no data rows after the header")
  width = len(header)
  for line, row in data:
    if len(row) != width:
      raise UserError(f"{path}: line {line} has {len(row)} field(s), the header has {width}")
  columns = {name: [row[index[name]].strip() for _, row in data] for name in wanted}
  lines = [line for line, _ in data]
  confidences = _float_column(path, columns["confidence"], "confidence", lines)
  confidences = _check_confidences(path, confidences, "confidence", lines)
  labels = None
  if "correct" in columns:
    correct = _bool_column(path, columns["correct"], lines)
    source = f"{path.name} (CSV: confidence, correct)"
  else:
    labels = _int_column(path, columns["y_true"], "y_true", lines)
    y_pred = _int_column(path, columns["y_pred"], "y_pred", lines)
    correct = labels == y_pred
    source = f"{path.name} (CSV: y_true, y_pred, confidence)"
  groups = names = None
  if group_key is not None:
    cells = [row[index[group_key]].strip() for _, row in data]
    groups, names = _group_column(path, cells, group_by.strip(), lines)
  return LoadedPredictions(confidences.astype(np.float32), correct, source, labels=labels,
                           groups=groups, group_names=names)


def _group_column(path: Path, cells: list[str], name: str,
                  lines: list[int]) -> tuple[np.ndarray, tuple[str, ...]]:
  """Group ids in sorted label order: integer labels numerically, else strings."""
  for i, cell in enumerate(cells):
    if cell == "":
      raise UserError(f"{path}: line {lines[i]}: empty {name} cell")
  try:
    values = np.array([int(cell) for cell in cells], dtype=np.int64)
  except ValueError:
    unique, ids = np.unique(np.array(cells, dtype=object).astype(str), return_inverse=True)
    return ids.astype(np.int64), tuple(str(u) for u in unique)
  unique, ids = np.unique(values, return_inverse=True)
  return ids.astype(np.int64), tuple(str(int(u)) for u in unique)


def _float_column(path: Path, cells: list[str], name: str, lines: list[int]) -> np.ndarray:
  for i, cell in enumerate(cells):
    if cell == "":
      raise UserError(f"{path}: line {lines[i]}: empty {name} cell")
  try:
    values = np.array(cells, dtype=np.float64)
  except ValueError:
    for i, cell in enumerate(cells):
      try:
        float(cell)
      except ValueError:
        raise UserError(f"{path}: line {lines[i]}: {name} {cell!r} is not a number") from None
    raise  # pragma: no cover  (numpy rejected a value that float() accepts)
  bad = np.flatnonzero(~np.isfinite(values))
  if bad.size:
    i = int(bad[0])
    raise UserError(f"{path}: line {lines[i]}: {name} {cells[i]!r} is not a finite number")
  return values


def _int_column(path: Path, cells: list[str], name: str, lines: list[int]) -> np.ndarray:
  values = _float_column(path, cells, name, lines)
  bad = np.flatnonzero(values != np.round(values))
  if bad.size:
    i = int(bad[0])
    raise UserError(f"{path}: line {lines[i]}: {name} {cells[i]!r} is not an integer class label")
  return values.astype(np.int64)


def _bool_column(path: Path, cells: list[str], lines: list[int]) -> np.ndarray:
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
      raise UserError(f"{path}: line {lines[i]}: correct {cell!r} must be 0/1 or true/false")
  return out


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
    return np.load(path, allow_pickle=False)
  except ValueError as e:
    raise UserError(f"{path}: cannot read as .npy ({e})") from None
  except OSError as e:
    raise UserError(f"{path}: cannot read: {e}") from None


def _load_npz(path: Path, scores: str) -> LoadedPredictions:
  try:
    archive = np.load(path, allow_pickle=False)
    if not isinstance(archive, np.lib.npyio.NpzFile):
      raise UserError(f"{path}: not an .npz archive (it holds a single array; rename it to .npy?)")
    with archive:
      arrays = {k: archive[k] for k in archive.files}
  except UserError:
    raise
  except (zipfile.BadZipFile, ValueError, EOFError) as e:
    raise UserError(f"{path}: not a valid .npz file ({e})") from None
  except OSError as e:
    raise UserError(f"{path}: cannot read: {e}") from None
  keys = ", ".join(sorted(arrays)) or "none"
  if "confidences" in arrays and "correct" in arrays:
    conf = _numeric(path, arrays["confidences"], "confidences")
    if conf.ndim != 1:
      raise UserError(f"{path}: confidences must be 1-D [n], got shape {conf.shape}")
    if conf.size == 0:
      raise UserError(f"{path}: confidences is empty")
    correct = _as_bool(path, arrays["correct"], "correct")
    if correct.shape != conf.shape:
      raise UserError(f"{path}: confidences has {conf.shape[0]} entries but correct has "
                      f"{correct.shape[0] if correct.ndim else 'a scalar'}")
    conf = _check_confidences(path, conf, "confidences")
    return LoadedPredictions(conf.astype(np.float32), correct,
                             f"{path.name} (npz: confidences, correct)")
  have = [k for k in ("probs", "logits") if k in arrays]
  if not have or "labels" not in arrays:
    raise UserError(f"{path}: expected the keys probs (or logits) and labels, or confidences "
                    f"and correct; found {keys}")
  if len(have) == 2:
    kind = "probs" if scores in ("auto", "probs") else "logits"
  else:
    kind = have[0]
    if scores != "auto" and scores != kind:
      raise UserError(f"{path}: --scores {scores} given but the file holds {kind}")
  return _from_scores(path, arrays[kind], path, arrays["labels"], kind,
                      f"{path.name} (npz: {kind}, labels)")


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
  if scores == "auto":
    kind = "probs" if _looks_like_probs(values) else "logits"
  else:
    kind = scores
  return _from_scores(path, values, labels_path, labels, kind,
                      f"{path.name} ({kind}) + {labels_path.name} (labels)")


def _looks_like_probs(values: np.ndarray) -> bool:
  if values.ndim != 2 or values.size == 0:
    return True  # let _from_scores report the shape problem
  return bool(values.min() >= 0.0 and values.max() <= 1.0
              and np.all(np.abs(values.sum(axis=1) - 1.0) <= _PROBS_ATOL))


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
                           scores, labels, kind == "logits")
