"""The CSV reader's three block parsers read the same files to the same arrays and refuse the
same files with the same message.

Every input goes through pyarrow's path (``"arrow"``), NumPy's (``"fast"``) and the csv module's
(``"careful"``, the reference), each with the careful path behind it as in the CLI, at several
chunk sizes: the chunks (arrays, dtypes, line ranges) and the error (type and full text) must be
equal. No JAX computation: these tests only read files.
"""

import io
import itertools
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import test_hostile
from cwsa_jax.cli import _arrow_csv
from cwsa_jax.cli import _csv
from cwsa_jax.cli import _lines
from cwsa_jax.cli._util import UserError

HAS_ARROW = _arrow_csv.modules() is not None
needs_arrow = pytest.mark.skipif(not HAS_ARROW, reason="pyarrow is not installed")
REFERENCE = ("careful",)
# The paths the CLI may take: each with the careful path behind it for what it gives up on.
PATHS = [("fast", "careful")] + ([("arrow", "careful"), ("arrow", "fast", "careful")]
                                 if HAS_ARROW else [])
CHUNKS = (1, 2, 3, 1000)


def read(path, parsers, chunk_rows, group_by=None):
  """("ok", chunks as tuples) or ("error", exception type, message)."""
  try:
    chunks = list(_csv.iter_csv_chunks(path, chunk_rows, group_by=group_by, parsers=parsers))
  except (UserError, ValueError) as e:
    return ("error", type(e).__name__, str(e))
  return ("ok", chunks)


def check_same(got, want, where):
  assert got[0] == want[0], (where, got, want)
  if got[0] == "error":
    assert got == want, where
    return
  assert len(got[1]) == len(want[1]), where
  for a, b in zip(got[1], want[1]):
    for field in _csv.CsvChunk._fields:
      x, y = getattr(a, field), getattr(b, field)
      if isinstance(y, np.ndarray):
        assert isinstance(x, np.ndarray) and x.dtype == y.dtype, (where, field, x, y)
        np.testing.assert_array_equal(x, y, err_msg=f"{where} {field}")
      else:
        assert x == y, (where, field, x, y)


def check_all_paths(path, group_by=None, chunks=CHUNKS):
  """Every path at every chunk size gives what the careful path gives; returns that."""
  results = []
  for chunk_rows in chunks:
    want = read(path, REFERENCE, chunk_rows, group_by)
    for parsers in PATHS:
      check_same(read(path, parsers, chunk_rows, group_by), want,
                 (parsers, chunk_rows, group_by))
    results.append(want)
  return results[0]


def write(tmp_path, data: bytes, name="p.csv"):
  path = tmp_path / name
  path.write_bytes(data)
  return path


def lines(*rows, end=b"\n"):
  return b"".join(row + end for row in rows)


# --------------------------------------------------------------------------
# Files that must be read: the same arrays from every path
# --------------------------------------------------------------------------


LABELS = lines(b"y_true,y_pred,confidence", b"0,0,0.9", b"1,2,0.25", b"2,2,1", b"1,1,0",
               b"0,1,0.5")
VALID = {
    "labels": LABELS,
    "labels CRLF": LABELS.replace(b"\n", b"\r\n"),
    "labels no final line end": LABELS.rstrip(b"\n"),
    "labels CRLF no final line end": LABELS.replace(b"\n", b"\r\n").rstrip(b"\r\n"),
    "BOM, header in any case with spaces, extra columns": (
        b"\xef\xbb\xbfid, Y_True ,note,y_PRED,Confidence\r\n"
        + lines(b"1,3,caf\xe9,3,0.75", b"2,4,\xff\xfe,3,.5", b"3, 5 , x ,5, 0.125 ", end=b"\r\n")),
    "integer labels in float forms": lines(
        b"y_true,y_pred,confidence", b"1.0,1,0.5", b"+2,2e0,0.5", b" 3 ,3.000,0.5",
        b"-7,-7.0,0.5", b"9007199254740992,0,1"),
    "confidences in every form": lines(
        b"confidence,correct", b".25,1", b"1E-3,0", b"+0.5,1", b"5e-324,1", b"1.0000001,1",
        b"-0.0000001,0", b"-0.0,0", b"0.1000000000000000055511151231257827,1",
        b"0.30000000000000004,0", b"1e-320,1", b"  0.5\t,1"),
    "booleans in every form": lines(
        b"confidence,correct", *(b"0.5," + w for w in (
            b"1", b"0", b"true", b"false", b"TRUE", b"False", b"t", b"F", b"yes", b"NO", b"1.0",
            b"0.0", b" 1 ", b"\ttrue"))),
    "class names": lines(b"y_true,y_pred,confidence", b"cat,cat,0.9", "Héron,cat,0.2".encode(),
                         "ünïcødé,ünïcødé,0.7".encode(), b" dog ,dog,0.6", b"x y,x y,0.4"),
    "class names that look like words for numbers": lines(
        b"y_true,y_pred,confidence", b"nan(1),nan(1),0.5", b"1_000,1_000,0.5", b"0x10,inf1,0.5",
        b"e5,.,0.5"),
    "blank lines everywhere": (b"\n\r\n  \n,,\ny_true,y_pred,confidence\n\n"
                               + lines(b"1,1,0.5", b"", b"2,1,0.25", b"\r", b",,", b" , ",
                                       b"3,3,0.75", b"", b"")),
    "only empty lines between rows": lines(b"confidence,correct", b"0.5,1", b"", b"", b"", b"",
                                           b"0.25,0", b"", b"0.75,1"),
    "semicolons": lines(b"y_true;y_pred;confidence", b"1;1;0.5", b"2;1;0.25"),
    "tabs": lines(b"confidence\tcorrect\tnote", b"0.5\t1\ta,b", b"0.25\t0\t;"),
    "pipes": lines(b"confidence|correct", b"0.5|yes", b"0.25|no"),
    "quoted fields, also over several lines": (
        b'confidence,note,correct\n0.5,"a\nb\nc",1\n"0.25","x,y",0\n0.75," ""q"" ",true\n'),
    "quotes in one block only": lines(b"confidence,correct", b"0.5,1", b"0.25,0", b'"0.75",1',
                                      b"0.125,0"),
    "a byte-order mark inside a row": lines(b"confidence,note,correct",
                                            b"0.5,x,1", b"0.25,\xef\xbb\xbf,0"),
    "a byte-order mark starting a row": lines(b"note,confidence,correct",
                                              b"x,0.5,1", b"\xef\xbb\xbfy,0.25,0"),
}


@pytest.mark.parametrize("name", list(VALID))
def test_valid_files_give_the_same_chunks_from_every_path(tmp_path, name):
  got = check_all_paths(write(tmp_path, VALID[name]))
  assert got[0] == "ok", got


GROUPS = lines(b"y_true,y_pred,confidence,Site", b"0,0,0.9,north", b"1,0,0.2, south ",
               b"1,1,0.7,caf\xe9", b"2,2,0.1,caf\xc3\xa9", b"0,0,0.4,north", b"1,1,0.3,7")


@pytest.mark.parametrize("data, group_by", [
    (GROUPS, "site"), (GROUPS, " SITE "), (GROUPS.replace(b"\n", b"\r\n"), "Site"),
    (lines(b"confidence,correct,batch", b"0.9,1,10", b"0.8,0,-1", b"0.7,1,2"), "batch"),
    (lines(b"y_true,y_pred,confidence", b"cat,cat,0.9", b"dog,cat,0.2"), "y_true"),
    (lines(b"confidence,correct", b"0.9,1", b"0.8,0"), "confidence"),
])
def test_group_by_gives_the_same_groups_from_every_path(tmp_path, data, group_by):
  got = check_all_paths(write(tmp_path, data), group_by)
  assert got[0] == "ok", got
  assert all(chunk.groups is not None for chunk in got[1])


def random_file(rng, n, kind, newline=b"\n"):
  """n rows in ``kind`` layout with blank lines here and there; its bytes."""
  c = rng.random(n)
  if kind == "correct":
    words = np.array([b"0", b"1", b"true", b"false", b"T", b"F", b"yes", b"no"])
    rows = [b"%r,%s" % (x, w) for x, w in zip(c.tolist(), words[rng.integers(0, 8, n)])]
    header = b"confidence,correct"
  elif kind == "labels":
    a, b = rng.integers(-3, 30, n), rng.integers(-3, 30, n)
    rows = [b"%d,%d,%r" % t for t in zip(a.tolist(), b.tolist(), c.tolist())]
    header = b"y_true,y_pred,confidence"
  else:
    names = np.array([b"airplane", b"cat", b"dog", b"H\xc3\xa9ron", b"x"])
    a, b = names[rng.integers(0, 5, n)], names[rng.integers(0, 5, n)]
    rows = [b"%s,%s,%r,g%d" % (t, p, x, i % 4) for i, (t, p, x) in
            enumerate(zip(a.tolist(), b.tolist(), c.tolist()))]
    header = b"y_true,y_pred,confidence,g"
  blank = rng.random(n) < 0.02
  out = [header] + [b"" if gap else row for row, gap in zip(rows, blank)]
  return newline.join(out) + newline


@pytest.mark.parametrize("kind", ["correct", "labels", "names"])
@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
def test_chunk_boundaries_change_nothing(tmp_path, kind, newline):
  """A file of 3000 rows at block sizes that cut it anywhere: every path gives the careful
  path's chunks, and their rows together are the same whatever the block size."""
  rng = np.random.default_rng(len(kind) + len(newline))
  path = write(tmp_path, random_file(rng, 3000, kind, newline))
  group_by = "g" if kind == "names" else None
  whole = None
  for chunk_rows in (7, 64, 1000, 65536):
    got = check_all_paths(path, group_by, chunks=(chunk_rows,))
    assert got[0] == "ok"
    assert all(1 <= c.confidences.size <= chunk_rows for c in got[1])
    joined = {f: np.concatenate([getattr(c, f) for c in got[1]])
              for f in ("confidences", "correct", "y_true", "y_pred", "groups")
              if getattr(got[1][0], f) is not None}
    if whole is None:
      whole = joined
    for field, values in joined.items():
      np.testing.assert_array_equal(values, whole[field], err_msg=field)


@needs_arrow
@pytest.mark.parametrize("name", ["labels", "labels CRLF", "labels no final line end",
                                  "BOM, header in any case with spaces, extra columns",
                                  "integer labels in float forms", "confidences in every form",
                                  "booleans in every form", "class names", "semicolons",
                                  "only empty lines between rows", "tabs", "pipes"])
def test_plain_files_take_the_arrow_path(tmp_path, name):
  """Without quotes or blank-looking rows, pyarrow's path takes every block itself (alone it
  raises on a block it gives up on)."""
  path = write(tmp_path, VALID[name])
  for chunk_rows in (1, 2, 1000):
    check_same(read(path, ("arrow",), chunk_rows), read(path, REFERENCE, chunk_rows), name)


@needs_arrow
def test_the_arrow_path_alone_names_what_it_gave_up_on(tmp_path):
  path = write(tmp_path, VALID["quoted fields, also over several lines"])
  with pytest.raises(RuntimeError, match="lines 2-6: the arrow path gave up"):
    list(_csv.iter_csv_chunks(path, parsers=("arrow",)))
  with pytest.raises(RuntimeError, match="the arrow and fast paths gave up"):
    list(_csv.iter_csv_chunks(path, parsers=("arrow", "fast")))


# --------------------------------------------------------------------------
# Files that must be refused: the same message from every path
# --------------------------------------------------------------------------


def labels_with(*rows):
  return lines(b"y_true,y_pred,confidence", b"0,0,0.9", b"1,1,0.8", *rows, b"2,2,0.7")


def correct_with(*rows):
  return lines(b"confidence,correct", b"0.9,1", b"0.8,0", *rows, b"0.7,1")


BROKEN = {
    "empty file": b"",
    "only blank lines": b"\n \n,,\n",
    "missing column": lines(b"y_true,confidence", b"0,0.9"),
    "missing column, semicolons": lines(b"y_true;y_pred;conf", b"1;1;0.9"),
    "duplicate column": lines(b"confidence,correct,Correct", b"0.9,1,1"),
    "UTF-16": "confidence,correct\n0.9,1\n".encode("utf-16"),
    "bare CR header": b"confidence,correct\r0.9,1\r",
    "bare CR in an unquoted field": lines(b"confidence,correct,note", b"0.5,1,ok", b"0.5,1,a\rb"),
    "bare CR between rows": lines(b"confidence,correct", b"0.5,1\r0.25,0"),
    "NUL byte": correct_with(b"0.5\x00,1"),
    "NUL byte in an unused column": lines(b"confidence,correct,x", b"0.5,1,\x00", b"0.5,1,a"),
    "no rows": lines(b"y_true,y_pred,confidence"),
    "no rows, blank lines": lines(b"y_true,y_pred,confidence", b"", b"  ", b",,", b""),
    "extra field": labels_with(b"1,1,0.5,x"),
    "missing field": labels_with(b"1,0.5"),
    "wrong delimiter in a row": lines(b"y_true,y_pred,confidence", b"1;1;0.9"),
    "decimal comma": lines(b"confidence;correct", b"0,9;1"),
    "decimal comma in a label": lines(b"y_true;y_pred;confidence", b"1,0;1;0.9"),
    "empty confidence": correct_with(b",1"),
    "blank confidence": correct_with(b"  ,1"),
    "confidence not a number": correct_with(b"high,1"),
    "confidence with a digit separator": correct_with(b"0_5,1"),
    "confidence in hex": correct_with(b"0x1p-1,1"),
    "confidence nan": correct_with(b"nan,1"),
    "confidence nan(1)": correct_with(b"nan(1),1"),
    "confidence inf": correct_with(b"inf,1"),
    "confidence -Infinity": correct_with(b"-Infinity,1"),
    "confidence 1e400": correct_with(b"1e400,1"),
    "confidence 1.5": correct_with(b"1.5,1"),
    "confidence -0.25": correct_with(b"-0.25,1"),
    "confidences out of range twice": correct_with(b"1e300,1", b"-1e300,0"),
    "confidence 12345678901234567890": correct_with(b"12345678901234567890,1"),
    "confidence with a Latin-1 byte": correct_with(b"0.9\xe9,1"),
    "byte-order mark before a confidence": correct_with(b"\xef\xbb\xbf0.5,1"),
    "quoted bad confidence": correct_with(b'"0.5x",1'),
    "bool maybe": correct_with(b"0.5,maybe"),
    "bool 2": correct_with(b"0.5,2"),
    "bool empty": correct_with(b"0.5,"),
    "bool yes please": correct_with(b"0.5,yes please"),
    "label 0.5": labels_with(b"0.5,1,0.5"),
    "label 1e30": labels_with(b"1,1e30,0.5"),
    "label 2**53 + 2": labels_with(b"9007199254740994,1,0.5"),
    "empty y_true": labels_with(b",1,0.5"),
    "empty y_pred": labels_with(b"1, ,0.5"),
    "label nan": labels_with(b"nan,1,0.5"),
    "label -inf": labels_with(b"1,-inf,0.5"),
    "label name among integers": labels_with(b"zebra,1,0.5"),
    "integer first written as 1.0, then a name": lines(
        b"y_true,y_pred,confidence", b"1.0,1,0.5", b"+2,2,0.5", b"3,3,0.5", b"cat,3,0.5"),
    "integer labels, then a name in the first row's y_pred": lines(
        b"y_true,y_pred,confidence", b" 1e0 ,cat,0.5"),
    "number among names": lines(b"y_true,y_pred,confidence", b"cat,cat,0.5", b"dog,cat,0.5",
                                b"cat,7,0.5"),
    "nan among names": lines(b"y_true,y_pred,confidence", b" cat ,cat,0.5", b"nan,cat,0.5"),
    "Latin-1 class name": lines(b"y_true,y_pred,confidence", b"cat,cat,0.5", b"H\xe9ron,cat,0.5",
                                b"cat,caf\xe9,0.5"),
    "Latin-1 class name, quoted": lines(b"y_true,y_pred,confidence", b'"cat",cat,0.5',
                                        b'"H\xe9ron",cat,0.5'),
    "unterminated quote": correct_with(b'0.5,"1'),
    "bad cell after many good rows": lines(b"confidence,correct", *[b"0.5,1"] * 9, b"0.5,maybe"),
}
BROKEN_GROUPS = {
    "group-by column not found": (lines(b"confidence,correct", b"0.9,1"), "site"),
    "group-by column empty name": (lines(b"confidence,correct", b"0.9,1"), " "),
    "empty group cell": (lines(b"confidence,correct,site", b"0.9,1,a", b"0.8,1, "), "site"),
    "group-by and a bad cell": (lines(b"confidence,correct,site", b"0.9,1,a", b"2,1,b"), "site"),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_files_give_the_same_error_from_every_path(tmp_path, name):
  got = check_all_paths(write(tmp_path, BROKEN[name]))
  assert got[:2] == ("error", "UserError"), got


@pytest.mark.parametrize("name", list(BROKEN_GROUPS))
def test_broken_group_by_gives_the_same_error_from_every_path(tmp_path, name):
  data, group_by = BROKEN_GROUPS[name]
  got = check_all_paths(write(tmp_path, data), group_by)
  assert got[:2] == ("error", "UserError"), got


def test_a_few_messages_word_for_word(tmp_path):
  """Pins of the careful path's wording, which every path above repeats."""
  path = write(tmp_path, BROKEN["integer first written as 1.0, then a name"])
  for parsers in PATHS:
    with pytest.raises(UserError) as e:
      list(_csv.iter_csv_chunks(path, 1, parsers=parsers))
    assert str(e.value) == (f"{path}: line 5: y_true 'cat' is not a number, but line 2 has the "
                            "integer label '1.0': class labels must be all integers or all names")
  path = write(tmp_path, BROKEN["confidences out of range twice"])
  for parsers in PATHS:
    with pytest.raises(UserError) as e:
      list(_csv.iter_csv_chunks(path, 1000, parsers=parsers))
    assert str(e.value) == (f"{path}: line 4: confidence 1e+300 is outside [0, 1] "
                            "(2 value(s) out of range in lines 2-6)")


# --------------------------------------------------------------------------
# The hostile-file generator of test_hostile, through every path
# --------------------------------------------------------------------------


READER = settings(max_examples=60, deadline=None, derandomize=True, database=None)


@READER
@given(case=test_hostile.csv_files(), chunk_rows=st.sampled_from([1, 2, 5, 64]))
def test_hostile_valid_files_through_every_path(tmp_path_factory, case, chunk_rows):
  data, (_, confidences, correct, _) = case
  path = write(tmp_path_factory.mktemp("h"), data)
  got = check_all_paths(path, chunks=(chunk_rows,))
  assert got[0] == "ok", got
  np.testing.assert_array_equal(np.concatenate([c.confidences for c in got[1]]), confidences)
  np.testing.assert_array_equal(np.concatenate([c.correct for c in got[1]]), correct)


@READER
@given(data=st.data(), refusal=st.sampled_from(test_hostile.REFUSALS),
       chunk_rows=st.sampled_from([1, 3, 64]))
def test_hostile_broken_files_through_every_path(tmp_path_factory, data, refusal, chunk_rows):
  content, (_, fragments) = data.draw(test_hostile.csv_files(refusal))
  path = write(tmp_path_factory.mktemp("h"), content)
  got = check_all_paths(path, chunks=(chunk_rows,))
  assert got[:2] == ("error", "UserError"), got
  for fragment in fragments:
    assert fragment in got[2], (fragment, got[2])


# --------------------------------------------------------------------------
# The line reader, the arguments and the optional import
# --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_line_blocks_are_islice_over_the_file(seed):
  """``_lines.Lines.take(n)`` hands out what ``islice(file, n)`` would, across its read buffer."""
  rng = np.random.default_rng(seed)
  size = [100, 5000, 700_000, 1_200_000][seed]
  data = rng.choice(np.frombuffer(b"ab,\n\r", np.uint8), size, p=[.4, .3, .2, .08, .02])
  data = data.tobytes() + (b"" if seed % 2 else b"\n")
  lines_ = _lines.Lines(io.BytesIO(data))
  want = io.BytesIO(data)
  while True:
    n = int(rng.choice([1, 2, 3, 17, 1000, 40_000]))
    expected = list(itertools.islice(want, n))
    if n == 1 and rng.random() < 0.5:
      got = [line for line in [lines_.readline()] if line]
    else:
      block, count = lines_.take(n)
      assert count == len(expected)
      got = _lines.split_lines(block)
    assert got == expected
    if not expected:
      break
  assert lines_.take(5) == (b"", 0) and lines_.readline() == b""


def test_parsers_argument(tmp_path):
  path = write(tmp_path, VALID["labels"])
  for bad in ((), ("numpy",), ("fast", "slow")):
    with pytest.raises(ValueError, match="parsers must be some of"):
      _csv.iter_csv_chunks(path, parsers=bad)
  assert set(_csv.default_parsers()) == ({"arrow", "fast", "careful"} if HAS_ARROW
                                         else {"fast", "careful"})
  check_same(read(path, None, 2), read(path, REFERENCE, 2), "default parsers")


def test_importing_the_reader_does_not_import_pyarrow():
  code = ("import sys, cwsa_jax.cli._csv as c; assert 'pyarrow' not in sys.modules; "
          "print(c.default_parsers())")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert ("arrow" in out.stdout) == HAS_ARROW
