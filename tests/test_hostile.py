"""Hostile inputs for ``cwsa-jax evaluate`` and ``compare``, and the chunked CSV reader.

Every generated file is either read correctly (the metrics match an independent float64
computation from the rows that were written) or refused with exit status 2 and one line on
stderr that names the file and the problem, without a traceback. The generator knows which of
the two each file must give. Either way the folder around the file is left as it was, apart
from the kit's own output folder.

Every generated file has N rows and, with labels, the same three true classes: one shape, so the
metrics compile once (a new shape costs seconds of XLA compilation per example).
"""

import argparse
import hashlib
import json
import os
import tempfile
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

import reference
from cwsa_jax import cli
from cwsa_jax.cli import _csv, _intervals, _io
from cwsa_jax.cli._util import UserError

N = 9
THRESHOLDS = np.array([0.5, 0.9], np.float32)
CLI_FLAGS = ["--no-figures", "--thresholds", "0.5,0.9"]
# Fixed and derandomized: the same examples on every run, nothing stored between runs.
HOSTILE = settings(max_examples=45, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture,
                                          HealthCheck.too_slow, HealthCheck.data_too_large])
NEEDED = {"y_true", "y_pred", "confidence", "correct"}
NAMES = ("cat", "dog", "bird", "fox", "Héron", "a,b", 'say "hi"', "x y", "1st", "ünïcødé")
EXTRA_NAMES = ("id", "note", "Unnamed: 0", "", "extra", "note", "ÿ-col", "a,b", 'q"t',
               "Confidences")


# --------------------------------------------------------------------------
# Helpers: the folder snapshot and one in-process CLI run
# --------------------------------------------------------------------------


def snapshot(folder: Path) -> dict:
  """Every file and folder below ``folder`` with a hash of its bytes."""
  return {p.relative_to(folder).as_posix():
          hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "folder"
          for p in sorted(folder.rglob("*"))}


def run_cli(capsys, folder: Path, argv: list) -> tuple[int, str, str, dict, dict]:
  """``cli.main(argv)`` with ``folder`` as the working directory; its snapshots around the run."""
  before = snapshot(folder)
  old = os.getcwd()
  os.chdir(folder)
  try:
    code = cli.main([str(a) for a in argv])
  finally:
    os.chdir(old)
  out, err = capsys.readouterr()
  return code, out, err, before, snapshot(folder)


def check_refused(code, err, before, after, command, subject, fragments):
  """Exit 2, one line ``cwsa-jax COMMAND: error: ...`` naming ``subject`` (the file, or the
  flag) and holding ``fragments``; the folder unchanged."""
  assert code == 2, err
  lines = err.splitlines()
  assert len(lines) == 1, err
  assert "Traceback" not in err
  assert lines[0].startswith(f"cwsa-jax {command}: error: "), lines[0]
  assert str(subject) in lines[0], lines[0]
  for fragment in fragments:
    assert fragment in lines[0], (fragment, lines[0])
  assert after == before  # nothing written, nothing left behind


def check_accepted(code, err, before, after, out_name="out"):
  """Exit 0, at most warnings on stderr, and nothing new or changed outside ``out_name``."""
  assert code == 0, err
  assert "Traceback" not in err
  for line in err.splitlines():
    assert line.startswith("cwsa-jax evaluate: warning: "), err
  new = {k: v for k, v in after.items() if k not in before or before[k] != v}
  assert new and all(k == out_name or k.startswith(out_name + "/") for k in new), sorted(new)
  assert all(after.get(k) == v for k, v in before.items())  # no input changed or removed


def as_float(values):
  return np.array(values, dtype=object).astype(float)


def check_metrics(out_dir: Path, confidences, correct):
  """metrics.json against reference.sweep on the rows' values (float32 confidences, as the kit
  documents), accuracy from the rows."""
  m = json.loads((out_dir / "metrics.json").read_text())
  c = np.asarray(confidences, np.float64).astype(np.float32)
  ok = np.asarray(correct, bool)
  assert m["n"] == len(ok)
  assert m["accuracy"] == pytest.approx(ok.mean(), abs=1e-6)
  want = reference.sweep(c, ok, THRESHOLDS)
  for j, field in enumerate(("coverage", "selective_accuracy", "cwsa", "cwsa_plus")):
    np.testing.assert_allclose(as_float(m["sweep"][field]), want[:, j], atol=2e-6, err_msg=field)
  return m


def check_bootstrap_skipped(err, m):
  """N is below the bootstrap minimum: evaluate warns and reports no intervals."""
  assert N < _intervals.MIN_BOOTSTRAP_SAMPLES
  assert f"n = {N} sample(s) is too few for bootstrap intervals" in err
  assert "intervals" not in m


# --------------------------------------------------------------------------
# CSV files: a table of cells, written with hostile formatting, maybe broken once
# --------------------------------------------------------------------------


def number_text(draw, value: float) -> str:
  form = draw(st.sampled_from(["repr", "17g", "3f", "e", "E", "plus", "short"]))
  if form == "repr":
    return repr(value)
  if form == "17g":
    return f"{value:.17g}"
  if form == "3f":
    return f"{value:.3f}"
  if form in ("e", "E"):
    text = f"{value:.6e}"
    return text.upper() if form == "E" else text
  if form == "plus":
    return "+" + repr(value)
  return repr(value).removeprefix("0")  # ".25"


def confidence_strategy():
  return st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, 1.0, 0.5, 0.9, 0.25, 5e-324]))


def int_label_text(draw, value: int) -> str:
  forms = [str(value), f"{value}.0", f"{value}e0"] + ([f"+{value}"] if value >= 0 else [])
  return draw(st.sampled_from(forms))


SPECIAL = b'\x00"\n\r,;\t|'
BOOL_TOKENS = {"1": True, "0": False, "true": True, "false": False, "t": True, "f": False,
               "yes": True, "no": False, "1.0": True, "0.0": False}


# What breaks a file, and what the one-line message must then say. Cell values go into one
# row; the message must also name that row's line.
STRUCTURE_REFUSALS = (
    ("missing column", "missing column"), ("duplicate column", "duplicate column"),
    ("extra field", "field(s), the header has"), ("missing field", "field(s), the header has"),
    ("NUL byte", "NUL byte"), ("no rows", "no data rows"), ("no header", "empty file"),
    ("UTF-16", "UTF-16"), ("bare CR", "bare CR"),
)
BAD_CONFIDENCES = (
    ("nan", "not a finite number"), ("inf", "not a finite number"),
    ("-Infinity", "not a finite number"), ("1e400", "not a finite number"),
    ("", "empty confidence cell"), ("high", "'high' is not a number"),
    ("0x1p-1", "is not a number"), ("1.5", "outside [0, 1]"), ("-0.25", "outside [0, 1]"),
    ("1e300", "outside [0, 1]"), ("-1e300", "outside [0, 1]"), ("12345678901234567890", "outside"),
)
BAD_LABELS = {
    "int": (("0.5", "'0.5' is not an integer class label"),
            ("1e30", "not an integer class label"), ("", "empty {column} cell"),
            ("nan", "not a finite number"), ("-inf", "not a finite number"),
            ("zebra", "all integers or all names")),
    "name": (("", "empty {column} cell"), ("7", "all integers or all names"),
             ("nan", "all integers or all names")),
}
BAD_BOOLS = (("maybe", "must be 0/1 or true/false"), ("2", "must be 0/1 or true/false"),
             ("", "empty correct cell"), ("yes please", "must be 0/1 or true/false"))
REFUSALS = (
    [("structure", what, fragment) for what, fragment in STRUCTURE_REFUSALS]
    + [("confidence", None, bad, fragment) for bad, fragment in BAD_CONFIDENCES]
    + [("label", mode, bad, fragment) for mode, cases in BAD_LABELS.items()
       for bad, fragment in cases]
    + [("correct", None, bad, fragment) for bad, fragment in BAD_BOOLS])


@st.composite
def csv_files(draw, refusal=None, kind=None, label_mode=None):
  """(bytes, expected): expected is ("ok", confidences, correct, class names) for a file that
  must be read, ("error", [fragments of the message]) for one that ``refusal`` breaks."""
  kind = kind or draw(st.sampled_from(["labels", "correct"]))
  label_mode = label_mode or draw(st.sampled_from(["int", "name"]))
  if refusal is not None and refusal[0] == "label":
    kind, label_mode = "labels", refusal[1]
  elif refusal is not None and refusal[0] == "correct":
    kind = "correct"
  delimiter = draw(st.sampled_from([",", ";", "\t", "|"]))
  plain = draw(st.booleans())  # nothing that needs quotes
  conf_cells = [number_text(draw, draw(confidence_strategy())) for _ in range(N)]
  confidences = [float(t) for t in conf_cells]
  columns = {"confidence": conf_cells}
  class_names = None
  if kind == "labels":
    true_ids = draw(st.permutations([0, 1, 2] * (N // 3)))
    pred_ids = [draw(st.integers(0, 3)) for _ in range(N)]
    if label_mode == "int":
      ints = draw(st.lists(st.integers(-1000, 10**6), min_size=4, max_size=4, unique=True))
      columns["y_true"] = [int_label_text(draw, ints[i]) for i in true_ids]
      columns["y_pred"] = [int_label_text(draw, ints[i]) for i in pred_ids]
      class_names = sorted({str(ints[i]) for i in true_ids}, key=int)
    else:
      pool = [n for n in NAMES if not (plain and set(n) & set(',;|"'))]
      names = draw(st.lists(st.sampled_from(pool), min_size=4, max_size=4, unique=True))
      columns["y_true"] = [names[i] for i in true_ids]
      columns["y_pred"] = [names[i] for i in pred_ids]
      class_names = sorted({names[i] for i in true_ids})
    correct = [t == p for t, p in zip(true_ids, pred_ids)]
  else:
    tokens = [draw(st.sampled_from(sorted(BOOL_TOKENS))) for _ in range(N)]
    columns["correct"] = [draw(st.sampled_from([t, t.upper(), t.title()])) for t in tokens]
    correct = [BOOL_TOKENS[t] for t in tokens]
  # Header names in any case, with spaces; extra columns that the reader must ignore.
  header = {name: draw(st.sampled_from([name, name.upper(), f" {name} ", name.title()]))
            for name in columns}
  cells = {name: [c.encode() for c in col] for name, col in columns.items()}
  order = list(columns)
  for k in range(draw(st.integers(0, 3))):
    key = f"extra{k}"
    header[key] = draw(st.sampled_from([n for n in EXTRA_NAMES
                                        if not (plain and set(n) & set(',;|"'))]))
    cells[key] = [draw(extra_cell(plain)) for _ in range(N)]
    order.append(key)
  order = draw(st.permutations(order))
  rows = [[cells[name][r] for name in order] for r in range(N)]
  header_row = [header[name].encode() for name in order]
  if refusal is None:
    data, _ = write_csv(draw, header_row, rows, delimiter, plain)
    return data, ("ok", confidences, correct, class_names)

  target = draw(st.integers(0, N - 1))
  what, fragment = refusal[1], refusal[-1]
  fragments = [fragment]
  if refusal[0] == "confidence":
    rows[target][order.index("confidence")] = refusal[2].encode()
  elif refusal[0] in ("label", "correct"):
    column = draw(st.sampled_from(["y_true", "y_pred"])) if kind == "labels" else "correct"
    rows[target][order.index(column)] = refusal[2].encode()
    fragments = [fragment.format(column=column)]
  elif what == "missing column":
    gone = order.index(draw(st.sampled_from([n for n in order if n in NEEDED])))
    header_row.pop(gone)
    for row in rows:
      row.pop(gone)
  elif what == "duplicate column":
    twin = draw(st.sampled_from([n for n in order if n in NEEDED]))
    header_row.append(header[twin].upper().encode())
    for row in rows:
      row.append(row[order.index(twin)])
    fragments.append(repr(twin))
  elif what == "extra field":
    rows[target].append(b"x")
    fragments.append(f"has {len(order) + 1} field(s), the header has {len(order)}")
  elif what == "missing field":
    rows[target].pop()
    fragments.append(f"has {len(order) - 1} field(s), the header has {len(order)}")
  elif what == "NUL byte":
    column = order.index("confidence")
    rows[target][column] = rows[target][column] + b"\x00"
  elif what == "no rows":
    rows = []
  elif what == "no header":
    rows, header_row = [], None
  data, row_lines = write_csv(draw, header_row, rows, delimiter, plain)
  if what == "UTF-16":
    data = data.decode("latin-1").encode("utf-16")
  elif what == "bare CR":
    data = data.replace(b"\r\n", b"\n").replace(b"\n", b"\r")
  if refusal[0] != "structure" or what in ("extra field", "missing field"):
    fragments.append(f"line {row_lines[target]}")
  return data, ("error", fragments)


def extra_cell(plain: bool):
  """Anything at all in a column the reader ignores: text, delimiters, quotes, line breaks,
  bytes that are not UTF-8 (no NUL: a NUL byte marks a binary file). ``plain``: nothing that
  needs quotes (such files take the NumPy path)."""
  if plain:
    return st.binary(max_size=6).map(lambda b: bytes(x for x in b if x not in SPECIAL))
  return st.one_of(
      st.text(max_size=8).map(lambda s: s.replace("\x00", "").encode()),
      st.binary(max_size=6).map(lambda b: b.replace(b"\x00", b"")),
      st.integers(-10**20, 10**20).map(lambda i: str(i).encode()),
      st.sampled_from([b"", b"caf\xe9", b"\xff\xfe", b'"', b"a\nb", b"a\r\nb", b"\r"]))


def write_csv(draw, header_row, rows, delimiter, plain=False):
  """The file's bytes and the line number each row starts on (the header is line 1 unless
  blank lines come before it)."""
  d = delimiter.encode()
  newlines = draw(st.sampled_from([[b"\n"], [b"\r\n"], [b"\n", b"\r\n"]]))
  out = [b"\xef\xbb\xbf"] if draw(st.booleans()) else []
  row_lines = []

  def emit(record: bytes):
    out.append(record + draw(st.sampled_from(newlines)))

  def blanks():
    for _ in range(draw(st.integers(0, 2))):
      emit(draw(st.sampled_from([b"", b"   ", d * draw(st.integers(1, 4)), b" " + d]
                                + ([] if plain else [b'""']))))

  # Quotes only where needed, or around some or all cells.
  style = "minimal" if plain else draw(st.sampled_from(["minimal", "some", "all"]))

  def record(cells):
    return d.join(quote(draw, c, d, style) for c in cells)

  blanks()
  if header_row is not None:
    emit(record(header_row))
  for row in rows:
    blanks()
    row_lines.append(b"".join(out).count(b"\n") + 1)
    emit(record(row))
  blanks()
  data = b"".join(out)
  if draw(st.booleans()):
    data = data.rstrip(b"\r\n") if rows else data  # no line break at the end of the file
  return data, row_lines


def quote(draw, cell: bytes, d: bytes, style: str) -> bytes:
  must = any(ch in cell for ch in (d, b'"', b"\n", b"\r"))
  if must or style == "all" or (style == "some" and draw(st.booleans())):
    pad = draw(st.sampled_from([b"", b" "]))
    return b'"' + pad + cell.replace(b'"', b'""') + pad + b'"'
  return draw(st.sampled_from([b"", b" "])) + cell + draw(st.sampled_from([b"", b" "]))


@pytest.mark.parametrize("kind, label_mode", [("correct", None), ("labels", "int"),
                                              ("labels", "name")])
@settings(HOSTILE, max_examples=15)
@given(data=st.data())
def test_hostile_csv_that_is_valid_is_read_exactly(capsys, kind, label_mode, data):
  data, (_, confidences, correct, class_names) = data.draw(csv_files(None, kind, label_mode))
  for feature, there in [("BOM", data.startswith(b"\xef\xbb\xbf")), ("CRLF", b"\r\n" in data),
                         ("quotes", b'"' in data), ("not UTF-8", not is_utf8(data)),
                         ("blank line", b"\n\n" in data or b"\n   " in data)]:
    event(f"{feature}: {there}")
  with tempfile.TemporaryDirectory() as tmp:
    folder = Path(tmp)
    path = folder / "preds.csv"
    path.write_bytes(data)
    (folder / "notes.txt").write_text("unrelated file")
    code, _, err, before, after = run_cli(capsys, folder,
                                          ["evaluate", path, "--out", folder / "out", *CLI_FLAGS])
    check_accepted(code, err, before, after)
    m = check_metrics(folder / "out", confidences, correct)
  check_bootstrap_skipped(err, m)
  if class_names is None:
    assert "classes" not in m
  else:  # labels mapped consistently: the per-class breakdown names the true classes
    assert m["classes"]["names"] == class_names


@pytest.mark.parametrize("refusal", REFUSALS, ids=lambda r: "-".join(str(x) for x in r[:3]))
@settings(HOSTILE, max_examples=3)
@given(data=st.data())
def test_hostile_csv_that_is_broken_is_refused_in_one_line(capsys, refusal, data):
  content, (_, fragments) = data.draw(csv_files(refusal))
  with tempfile.TemporaryDirectory() as tmp:
    folder = Path(tmp)
    path = folder / "preds.csv"
    path.write_bytes(content)
    (folder / "notes.txt").write_text("unrelated file")
    code, _, err, before, after = run_cli(capsys, folder,
                                          ["evaluate", path, "--out", folder / "out", *CLI_FLAGS])
  check_refused(code, err, before, after, "evaluate", path, fragments)


@settings(HOSTILE, max_examples=40)
@given(case=csv_files(), chunk_rows=st.sampled_from([1, 2, 3, 5, 64]))
def test_chunks_agree_with_the_whole_file_and_the_careful_parser(case, chunk_rows):
  data, (_, confidences, correct, class_names) = case
  with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "p.csv"
    path.write_bytes(data)
    chunks = list(_io.iter_csv_chunks(path, chunk_rows))
    careful = careful_chunks(path, chunk_rows)
    whole = _io.load_predictions(path)
  for chunk in chunks:
    assert 1 <= chunk.confidences.size <= chunk_rows
    assert chunk.first_line <= chunk.last_line
  assert all(a.last_line < b.first_line for a, b in zip(chunks, chunks[1:]))
  # Every value exactly as Python's float() reads the cell, whichever path parsed it.
  np.testing.assert_array_equal(np.concatenate([c.confidences for c in chunks]), confidences)
  np.testing.assert_array_equal(np.concatenate([c.correct for c in chunks]), correct)
  for field in ("confidences", "correct", "y_true", "y_pred"):
    if getattr(chunks[0], field) is None:
      assert all(getattr(c, field) is None for c in chunks + careful)
      continue
    np.testing.assert_array_equal(np.concatenate([getattr(c, field) for c in chunks]),
                                  np.concatenate([getattr(c, field) for c in careful]))
  np.testing.assert_array_equal(whole.confidences, np.float32(confidences))
  np.testing.assert_array_equal(whole.correct, correct)
  if class_names is not None:
    assert list(_io.class_groups(whole)[1]) == class_names


def is_utf8(data):
  try:
    data.decode()
  except UnicodeDecodeError:
    return False
  return True


def careful_chunks(path, chunk_rows):
  """The file through the careful (csv module) path only."""
  return list(_csv.iter_csv_chunks(path, chunk_rows, parsers=("careful",)))


@pytest.mark.parametrize("refusal", REFUSALS[:9] + REFUSALS[9:12],
                         ids=lambda r: "-".join(str(x) for x in r[:3]))
@settings(HOSTILE, max_examples=1)
@given(data=st.data())
def test_compare_refuses_a_broken_file_in_one_line(capsys, refusal, data):
  good, _ = data.draw(csv_files())
  broken, (_, fragments) = data.draw(csv_files(refusal))
  with tempfile.TemporaryDirectory() as tmp:
    folder = Path(tmp)
    (folder / "a.csv").write_bytes(good)
    (folder / "b.csv").write_bytes(broken)
    code, _, err, before, after = run_cli(capsys, folder, ["compare", folder / "a.csv",
                                                           folder / "b.csv", "--out",
                                                           folder / "cmp.json"])
  check_refused(code, err, before, after, "compare", folder / "b.csv", fragments)


# --------------------------------------------------------------------------
# .npz files: dtypes, extra members, and one broken array
# --------------------------------------------------------------------------


def unrelated_array():
  """Anything at all under a key the reader does not need, pickled objects included."""
  return st.sampled_from([
      np.array([{"a": 1}, None], dtype=object), np.array(["x", "é"]), np.zeros((2, 0)),
      np.array(3.5), np.array([np.nan, np.inf]), np.array([1 + 2j]), np.arange(4, dtype=np.uint64),
  ])


@st.composite
def npz_arrays(draw, fmt):
  """(arrays to save, reference confidences, reference correct, true labels)."""
  labels = np.array(draw(st.permutations([0, 1, 2] * (N // 3))))
  labels = labels.astype(draw(st.sampled_from(
      [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint64, np.float32, np.float64])))
  float_type = draw(st.sampled_from([np.float32, np.float64]))
  if fmt == "probs":
    raw = np.array(draw(st.lists(st.lists(st.floats(1e-3, 1.0), min_size=3, max_size=3),
                                 min_size=N, max_size=N)))
    probs = (raw / raw.sum(axis=1, keepdims=True)).astype(float_type)
    stored = probs.astype(np.float64)
    arrays = {"probs": probs, "labels": labels}
    conf, ok = stored.max(axis=1), stored.argmax(axis=1) == labels
  elif fmt == "logits":
    logits = np.array(draw(st.lists(st.lists(st.floats(-30.0, 30.0), min_size=3, max_size=3),
                                    min_size=N, max_size=N))).astype(float_type)
    stored = logits.astype(np.float64)
    conf = np.exp(stored.max(axis=1) - np.logaddexp.reduce(stored, axis=1))
    ok = stored.argmax(axis=1) == labels
    arrays = {"logits": logits, "labels": labels}
  else:
    conf = np.array(draw(st.lists(confidence_strategy(), min_size=N, max_size=N)))
    conf = conf.astype(draw(st.sampled_from([np.float16, np.float32, np.float64])))
    ok = np.array(draw(st.lists(st.booleans(), min_size=N, max_size=N)))
    arrays = {"confidences": conf,
              "correct": ok.astype(draw(st.sampled_from([bool, np.int8, np.int64, np.float32])))}
    conf = conf.astype(np.float64)
    labels = None
  # Keys the reader must not touch: scores beside confidences, logits beside probs, anything.
  for key in draw(st.lists(st.sampled_from(["logits", "probs", "labels", "extra", "meta"]),
                           max_size=2, unique=True)):
    if key in arrays or (key == "probs" and "logits" in arrays):
      continue
    if key in ("probs", "labels") and fmt != "confidences":
      continue
    arrays[key] = draw(unrelated_array())
  return arrays, conf, ok, labels


def _replace(key, make):
  def mutate(arrays):
    arrays[key] = make(arrays[key])
  return mutate


def _with_nan(a):
  a = a.astype(np.float64)
  a.flat[1] = np.nan
  return a


def _drop(key):
  def mutate(arrays):
    del arrays[key]
  return mutate


NPZ_REFUSALS = (
    ("probs", "NaN", _replace("probs", _with_nan), "NaN or infinite"),
    ("logits", "inf", _replace("logits", lambda a: np.where(a == a.max(), np.inf, a)),
     "NaN or infinite"),
    ("confidences", "NaN", _replace("confidences", _with_nan), "NaN or infinite"),
    ("probs", "text labels", _replace("labels", lambda a: a.astype(str)), "must be numeric"),
    ("logits", "complex", _replace("logits", lambda a: a + 1j), "must be numeric"),
    ("confidences", "bool", _replace("confidences", lambda a: a > 0.5), "must be numeric"),
    ("probs", "object labels", _replace("labels", lambda a: a.astype(object)),
     "cannot read labels"),
    ("confidences", "object", _replace("correct", lambda a: a.astype(object)),
     "cannot read correct"),
    ("probs", "short labels", _replace("labels", lambda a: a[:-1]), "labels have 8"),
    ("confidences", "short correct", _replace("correct", lambda a: a[:-1]), "correct has 8"),
    ("logits", "1-D", _replace("logits", lambda a: a[:, 0]), "shape [n, num_classes]"),
    ("confidences", "2-D", _replace("confidences", lambda a: a[:, None]), "1-D"),
    ("probs", "0-d labels", _replace("labels", lambda a: a[0]), "labels must be 1-D"),
    ("confidences", "0-d correct", _replace("correct", lambda a: a[0]), "correct must be 1-D"),
    ("probs", "no labels", _drop("labels"), "expected the keys"),
    ("confidences", "no correct", _drop("correct"), "expected the keys"),
    ("probs", "label 3", _replace("labels", lambda a: np.where(a == 2, 3, a)), "[0, 3)"),
    ("logits", "label -1", _replace("labels", lambda a: a.astype(np.int64) - 1), "[0, 3)"),
    ("probs", "label 0.5", _replace("labels", lambda a: a + 0.5), "integer class indices"),
    ("probs", "sum 2", _replace("probs", lambda a: a * 2), "probs"),
    ("confidences", "1.5", _replace("confidences", lambda a: a + 1.5), "outside [0, 1]"),
    ("confidences", "correct 2",
     _replace("correct", lambda a: np.concatenate([[2], a[1:].astype(np.int64)])),
     "boolean or 0/1"),
    ("confidences", "empty", lambda arrays: arrays.update(confidences=np.zeros(0),
                                                        correct=np.zeros(0, bool)), "empty"),
    ("logits", "empty", _replace("logits", lambda a: a[:0]), "empty"),
)


def write_npz(path: Path, arrays: dict) -> None:
  with open(path, "wb") as f:
    np.savez(f, **arrays)


@pytest.mark.parametrize("fmt", ["probs", "logits", "confidences"])
@settings(HOSTILE, max_examples=10)
@given(data=st.data())
def test_hostile_npz_that_is_valid_is_read_exactly(capsys, fmt, data):
  arrays, conf, ok, labels = data.draw(npz_arrays(fmt))
  with tempfile.TemporaryDirectory() as tmp:
    folder = Path(tmp)
    path = folder / "preds.npz"
    write_npz(path, arrays)
    code, _, err, before, after = run_cli(capsys, folder,
                                          ["evaluate", path, "--out", folder / "out", *CLI_FLAGS])
    check_accepted(code, err, before, after)
    m = check_metrics(folder / "out", conf, ok)
  check_bootstrap_skipped(err, m)
  if labels is not None:
    assert m["classes"]["names"] == ["0", "1", "2"]
    assert m["classes"]["counts"] == [3, 3, 3]


@pytest.mark.parametrize("fmt, name, mutate, fragment", NPZ_REFUSALS,
                         ids=[f"{r[0]}-{r[1]}" for r in NPZ_REFUSALS])
@settings(HOSTILE, max_examples=2)
@given(data=st.data())
def test_hostile_npz_that_is_broken_is_refused_in_one_line(capsys, fmt, name, mutate, fragment,
                                                           data):
  arrays, *_ = data.draw(npz_arrays(fmt))
  mutate(arrays)
  with tempfile.TemporaryDirectory() as tmp:
    folder = Path(tmp)
    path = folder / "preds.npz"
    write_npz(path, arrays)
    code, _, err, before, after = run_cli(capsys, folder,
                                          ["evaluate", path, "--out", folder / "out", *CLI_FLAGS])
  check_refused(code, err, before, after, "evaluate", path, [fragment])


@pytest.mark.parametrize("content, fragment", [
    (b"not a zip archive", "not a valid .npz file"),
    (b"", "not a valid .npz file"),
    ("npy", "not an .npz archive"),
    ("junk member", "cannot read labels"),
    ("raw member", "is not a .npy array"),
    ("truncated", "preds.npz"),
])
def test_npz_containers_that_are_broken(tmp_path, capsys, content, fragment):
  path = tmp_path / "preds.npz"
  good = {"probs": np.full((N, 3), 1 / 3), "labels": np.arange(N) % 3}
  if content == "npy":
    np.save(tmp_path / "x.npy", good["probs"])
    (tmp_path / "x.npy").rename(path)
  elif content in ("junk member", "raw member"):
    with zipfile.ZipFile(path, "w") as z:
      buffer = tmp_path / "p.npy"
      np.save(buffer, good["probs"])
      z.write(buffer, "probs.npy")
      buffer.unlink()
      if content == "junk member":
        z.writestr("labels.npy", b"\x93NUMPY junk")
      else:
        z.writestr("labels", b"plain bytes")
  elif content == "truncated":
    write_npz(path, good)
    path.write_bytes(path.read_bytes()[:-40])
  else:
    path.write_bytes(content)
  code, _, err, before, after = run_cli(capsys, tmp_path,
                                        ["evaluate", path, "--out", tmp_path / "out", *CLI_FLAGS])
  check_refused(code, err, before, after, "evaluate", path, [fragment])


@pytest.mark.parametrize("scores, labels, fragment", [
    (np.array([["a", "b"]] * N), np.arange(N) % 2, "scores must be numeric"),
    (np.full((N, 2), 0.5), np.arange(N - 1) % 2, "labels have 8"),
    (np.full((N, 2), 0.5), (np.arange(N) % 2).astype(object), "cannot read"),
    (np.full((N, 2), 0.5), np.arange(N) % 2 + 0.5, "integer class indices"),
    (np.full(N, 0.5), np.arange(N) % 2, "shape [n, num_classes]"),
])
def test_hostile_npy_pairs_are_refused_in_one_line(tmp_path, capsys, scores, labels, fragment):
  np.save(tmp_path / "scores.npy", scores)
  np.save(tmp_path / "labels.npy", labels, allow_pickle=True)
  code, _, err, before, after = run_cli(
      capsys, tmp_path, ["evaluate", tmp_path / "scores.npy", "--labels", tmp_path / "labels.npy",
                         "--out", tmp_path / "out", *CLI_FLAGS])
  lines = err.splitlines()
  assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
  assert fragment in lines[0] and ".npy" in lines[0], lines[0]
  assert after == before


# --------------------------------------------------------------------------
# The cases, one by one
# --------------------------------------------------------------------------


ROWS = [("cat", "cat", "0.9"), ("dog", "cat", "0.6"), ("bird", "bird", "0.75"),
        ("dog", "dog", "0.3")]


def write_rows(path, header, rows, delimiter=",", encoding="utf-8"):
  text = "\n".join([delimiter.join(header)] + [delimiter.join(r) for r in rows]) + "\n"
  path.write_bytes(text.encode(encoding))
  return path


@pytest.mark.parametrize("delimiter", [";", "\t", "|"])
def test_semicolon_tab_and_pipe_files_read_like_commas(tmp_path, delimiter):
  comma = _io.load_predictions(write_rows(tmp_path / "a.csv", ["y_true", "y_pred", "confidence"],
                                          ROWS))
  other = _io.load_predictions(write_rows(tmp_path / "b.csv", ["y_true", "y_pred", "confidence"],
                                          ROWS, delimiter))
  np.testing.assert_array_equal(other.confidences, np.float32([0.9, 0.6, 0.75, 0.3]))
  np.testing.assert_array_equal(other.correct, [True, False, True, True])
  np.testing.assert_array_equal(other.labels, comma.labels)


def test_decimal_commas_and_a_wrong_delimiter_are_named(tmp_path, capsys):
  path = write_rows(tmp_path / "eu.csv", ["confidence", "correct"], [("0,9", "1")], ";")
  code, _, err, before, after = run_cli(capsys, tmp_path, ["evaluate", path, *CLI_FLAGS])
  check_refused(code, err, before, after, "evaluate", path, ["line 2", "'0,9'", "decimal comma"])
  path = tmp_path / "mixed.csv"
  path.write_text("y_true,y_pred,confidence\n1;1;0.9\n")
  code, _, err, before, after = run_cli(capsys, tmp_path, ["evaluate", path, *CLI_FLAGS])
  check_refused(code, err, before, after, "evaluate", path, ["line 2", "delimiter ';'?"])
  path = tmp_path / "header.csv"
  path.write_text("y_true;y_pred;conf\n1;1;0.9\n")
  code, _, err, before, after = run_cli(capsys, tmp_path, ["evaluate", path, *CLI_FLAGS])
  check_refused(code, err, before, after, "evaluate", path,
                ["missing column(s) confidence", "(delimiter ';')"])
  path = tmp_path / "cr.csv"
  path.write_bytes(b"confidence,correct,note\n0.5,1,ok\n0.5,1,a\rb\n")
  code, _, err, before, after = run_cli(capsys, tmp_path, ["evaluate", path, *CLI_FLAGS])
  check_refused(code, err, before, after, "evaluate", path, ["line 3", "carriage return"])


def test_string_labels_map_consistently_and_help_says_so(tmp_path, capsys):
  loaded = _io.load_predictions(write_rows(tmp_path / "s.csv", ["y_true", "y_pred", "confidence"],
                                           ROWS + [("fox", "cat", "0.5")]))
  assert loaded.class_names == ("bird", "cat", "dog", "fox")  # y_true and y_pred together
  np.testing.assert_array_equal(loaded.labels, [1, 2, 0, 2, 3])
  np.testing.assert_array_equal(loaded.correct, [True, False, True, True, False])
  assert _io.class_groups(loaded)[1] == ("bird", "cat", "dog", "fox")
  np.testing.assert_array_equal(_io.label_values(loaded), ["cat", "dog", "bird", "dog", "fox"])
  with pytest.raises(SystemExit):
    cli.main(["evaluate", "--help"])
  assert "class names" in " ".join(capsys.readouterr().out.split())


def test_a_byte_that_is_not_utf8_in_an_unused_column_is_ignored(tmp_path):
  path = tmp_path / "latin1.csv"
  path.write_bytes(b"id,note,confidence,correct\n1,caf\xe9,0.9,1\n2,\xff\xfe,0.2,0\n")
  loaded = _io.load_predictions(path)
  np.testing.assert_array_equal(loaded.confidences, np.float32([0.9, 0.2]))
  np.testing.assert_array_equal(loaded.correct, [True, False])
  # In a column that is read, the byte is shown in the message, without a traceback.
  path.write_bytes(b"confidence,correct\n0.9\xe9,1\n")
  with pytest.raises(UserError, match=r"line 2: confidence '0\.9\ufffd' is not a number"):
    _io.load_predictions(path)


def test_group_names_that_are_not_utf8_are_kept_apart(tmp_path):
  path = tmp_path / "g.csv"
  path.write_bytes(b"confidence,correct,site\n0.9,1,caf\xe9\n0.8,1,caf\xc3\xa9\n0.7,0,caf\xe9\n")
  loaded = _io.load_predictions(path, group_by="site")
  assert len(loaded.group_names) == 2 and "café" in loaded.group_names
  assert loaded.groups[0] == loaded.groups[2] != loaded.groups[1]


def test_the_chunk_api(tmp_path):
  path = tmp_path / "p.csv"
  path.write_text("confidence,correct\n" + "".join(f"0.{i},{i % 2}\n" for i in range(1, 10)))
  chunks = list(_io.iter_csv_chunks(path, 4))
  assert [c.confidences.size for c in chunks] == [4, 4, 1]
  assert [(c.first_line, c.last_line) for c in chunks] == [(2, 5), (6, 9), (10, 10)]
  np.testing.assert_array_equal(np.concatenate([c.correct for c in chunks]),
                                np.arange(1, 10) % 2 == 1)
  for bad in (0, -1, 2.5, True):
    with pytest.raises(ValueError, match="chunk_rows"):
      _io.iter_csv_chunks(path, bad)  # at the call, not at the first block
  # A quoted field over several lines that runs past a block's end joins that block.
  path.write_text('confidence,note,correct\n0.5,"a\nb\nc",1\n0.25,x,0\n')
  chunks = list(_io.iter_csv_chunks(path, 1))
  assert [(c.first_line, c.last_line) for c in chunks] == [(2, 4), (5, 5)]
  # A bad cell in a later block names its own line.
  path.write_text("confidence,correct\n" + "0.5,1\n" * 7 + "0.5,maybe\n")
  with pytest.raises(UserError, match="line 9: correct 'maybe'"):
    list(_io.iter_csv_chunks(path, 3))


def test_plain_files_take_the_numpy_path(tmp_path):
  """BOM, CRLF, empty lines, extra columns with any bytes: no row goes through the csv module
  (with the fast path alone, a block it gave up on would raise)."""
  rng = np.random.default_rng(0)
  c = rng.random(1000)
  rows = [f"{i},{i % 3},{(i * 7) % 3},{x!r},\xff{i}\r\n".encode("latin-1")
          for i, x in enumerate(c.tolist())]
  path = tmp_path / "p.csv"
  path.write_bytes(b"\xef\xbb\xbfid,y_true,y_pred,confidence,note\r\n" + b"".join(rows[:500])
                   + b"\r\n" + b"".join(rows[500:]))

  chunks = list(_csv.iter_csv_chunks(path, 128, parsers=("fast",)))
  loaded = _io._load_table(path, _csv.iter_csv_chunks(path, parsers=("fast",)))
  np.testing.assert_array_equal(np.concatenate([k.confidences for k in chunks]), c)
  np.testing.assert_array_equal(loaded.correct, np.arange(1000) % 3 == (np.arange(1000) * 7) % 3)
  # the same file with a quoted field: the fast path alone gives up on that block
  path.write_bytes(b"confidence,correct\n0.5,1\n\"0.25\",0\n")
  with pytest.raises(RuntimeError, match="fast path gave up"):
    list(_csv.iter_csv_chunks(path, parsers=("fast",)))


def test_loading_memory_is_bounded_by_the_block(tmp_path):
  """Peak traced memory: the arrays kept plus one block, not Python objects per row (the
  csv-module reader took about 14x the file's size)."""
  n = 50_000
  rng = np.random.default_rng(1)
  path = tmp_path / "big.csv"
  with open(path, "w") as f:
    f.write("y_true,y_pred,confidence\n")
    f.writelines(f"{a},{b},{x!r}\n" for a, b, x in zip(rng.integers(0, 10, n).tolist(),
                                                        rng.integers(0, 10, n).tolist(),
                                                        rng.random(n).tolist()))
  _io._load_table(path, _csv.iter_csv_chunks(path, 2000))  # imports the reader's modules
  tracemalloc.start()
  try:  # load_predictions' reading of a CSV, in blocks of 2000 rows
    loaded = _io._load_table(path, _csv.iter_csv_chunks(path, 2000))
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  kept = loaded.confidences.nbytes + loaded.correct.nbytes + loaded.labels.nbytes
  # Full float64 decimals: the float64 confidences are kept too (their threshold comparisons).
  assert loaded.wide_confidences is not None
  kept += loaded.wide_confidences.nbytes
  assert loaded.confidences.size == n
  assert peak < 2 * kept + 1_000_000, (peak, kept, path.stat().st_size)
  assert peak < 2 * path.stat().st_size


# --------------------------------------------------------------------------
# compare: what it can and cannot check; bootstrap sizes that mean nothing
# --------------------------------------------------------------------------


def test_bootstrap_flags_refuse_too_few_resamples(tmp_path, capsys):
  path = write_rows(tmp_path / "p.csv", ["y_true", "y_pred", "confidence"], ROWS)
  for command in (["evaluate", path], ["compare", path, path]):
    code, _, err, before, after = run_cli(capsys, tmp_path, [*command, "--bootstrap", "1"])
    check_refused(code, err, before, after, command[0], "--bootstrap 1",
                  ["too few resamples for 95% intervals", "at least 200"])
  code, _, err, before, after = run_cli(
      capsys, tmp_path, ["compare", path, path, "--bootstrap", "500", "--level", "0.99"])
  check_refused(code, err, before, after, "compare", "--bootstrap 500", ["at least 1000"])
  assert _intervals.min_resamples(0.95) == 200 and _intervals.min_resamples(0.9) == 100


def test_compare_refuses_too_few_samples_and_different_class_names(tmp_path, capsys):
  one = write_rows(tmp_path / "one.csv", ["confidence", "correct"], [("0.765", "1")])
  code, _, err, before, after = run_cli(capsys, tmp_path, ["compare", one, one])
  check_refused(code, err, before, after, "compare", "n = 1", ["too few for bootstrap"])
  a = write_rows(tmp_path / "a.csv", ["y_true", "y_pred", "confidence"], ROWS * 3)
  # The same true classes under other predictions: label ids differ, names do not.
  b_rows = [(t, "aardvark", c) for t, _, c in ROWS * 3]
  b = write_rows(tmp_path / "b.csv", ["y_true", "y_pred", "confidence"], b_rows)
  assert not np.array_equal(_io.load_predictions(a).labels, _io.load_predictions(b).labels)
  np.testing.assert_array_equal(_io.label_values(_io.load_predictions(a)),
                                _io.label_values(_io.load_predictions(b)))
  c = write_rows(tmp_path / "c.csv", ["y_true", "y_pred", "confidence"], ROWS[::-1] * 3)
  code, _, err, before, after = run_cli(capsys, tmp_path, ["compare", a, c])
  check_refused(code, err, before, after, "compare", a, ["different labels"])


def test_evaluate_skips_intervals_for_too_few_samples(capsys):
  args = argparse.Namespace(bootstrap=1000, command="evaluate")
  assert _intervals.bootstrap_resamples(args, 1, refuse=False) == 0
  err = capsys.readouterr().err
  assert err.splitlines() == ["cwsa-jax evaluate: warning: n = 1 sample(s) is too few for "
                              "bootstrap intervals (need at least 10); no intervals reported"]
  assert _intervals.bootstrap_resamples(args, 10, refuse=False) == 1000
  with pytest.raises(UserError, match="n = 3"):
    _intervals.bootstrap_resamples(args, 3, refuse=True)
  assert capsys.readouterr().err == ""
