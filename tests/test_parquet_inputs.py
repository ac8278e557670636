"""``cwsa-jax evaluate`` on Parquet files and on several inputs (shards) read as one evaluation.

A Parquet file gives exactly the metrics of the equivalent CSV; three shards (CSV, Parquet or
both), a folder of shards or a quoted glob pattern give exactly the metrics of the one file
holding all the rows; every bad input is refused with exit status 2 and one line on stderr that
names the file, and nothing is written.

Every full evaluation has N rows (one shape: the metrics compile once).
"""

import json
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from cwsa_jax import cli
from cwsa_jax.cli import _io, _parquet
from cwsa_jax.cli._util import UserError

try:
  import pyarrow as pa
  import pyarrow.parquet as pq
except ImportError:  # the parquet extra is optional
  pa = pq = None

needs_pyarrow = pytest.mark.skipif(pa is None, reason="needs pyarrow (the parquet extra)")
N = 300
FAST = ["--bootstrap", "0", "--no-figures"]
NAMES = ("cat", "dog", "bird", "fox")


# --------------------------------------------------------------------------
# Data and writers
# --------------------------------------------------------------------------


def columns(kind: str, n: int = N, seed: int = 0) -> dict:
  """Predictions as columns: ``labels`` (integers), ``names`` (class names) or ``correct``.

  Each has a ``site`` column of integer group labels (2 and 10: sorted numerically).
  """
  rng = np.random.default_rng(seed)
  conf = rng.uniform(0.2, 1.0, n)
  conf[:3] = [0.0, 1.0, 0.5]
  y_true = rng.integers(0, 4, n)
  y_pred = np.where(rng.uniform(size=n) < conf, y_true, (y_true + 1) % 4)
  site = rng.choice([2, 10, 7], n)
  if kind == "correct":
    return {"confidence": conf, "correct": y_true == y_pred, "site": site}
  if kind == "names":
    y_true, y_pred = (np.asarray(NAMES)[y] for y in (y_true, y_pred))
  return {"y_true": y_true, "y_pred": y_pred, "confidence": conf, "site": site}


def part(data: dict, start: int, stop: int) -> dict:
  return {name: values[start:stop] for name, values in data.items()}


def cell(value) -> str:
  if isinstance(value, (bool, np.bool_)):
    return "true" if value else "false"
  if isinstance(value, (float, np.floating)):
    return repr(float(value))
  return str(value)


def write_csv(path: Path, data: dict) -> Path:
  names = list(data)
  rows = zip(*(data[name] for name in names))
  path.write_text(",".join(names) + "\n" + "".join(",".join(cell(v) for v in row) + "\n"
                                                   for row in rows))
  return path


def write_parquet(path: Path, data, **kwargs) -> Path:
  table = data if isinstance(data, pa.Table) else pa.table(data)
  pq.write_table(table, path, **kwargs)
  return path


def write(path: Path, data: dict) -> Path:
  return write_csv(path, data) if path.suffix == ".csv" else write_parquet(path, data,
                                                                           row_group_size=64)


# --------------------------------------------------------------------------
# Running the CLI in-process
# --------------------------------------------------------------------------


def evaluate(tmp_path: Path, capsys, *args, out: str = "out") -> dict:
  """metrics.json of ``cwsa-jax evaluate ARGS`` (which must succeed)."""
  code = cli.main(["evaluate", *map(str, args), "--out", str(tmp_path / out), *FAST])
  captured = capsys.readouterr()
  assert code == 0, captured.err
  return json.loads((tmp_path / out / "metrics.json").read_text())


def numbers(payload: dict) -> dict:
  """metrics.json without the keys that name the input files."""
  return {k: v for k, v in payload.items() if k not in ("file", "files", "source")}


def check_bad(tmp_path: Path, capsys, args: list, *fragments: str) -> str:
  """Exit 2, one line on stderr with ``fragments``, no traceback, nothing written."""
  out = tmp_path / "bad-out"
  before = sorted(p.name for p in tmp_path.rglob("*"))
  code = cli.main(["evaluate", *map(str, args), "--out", str(out), *FAST])
  captured = capsys.readouterr()
  assert code == 2, captured.err
  lines = captured.err.strip().splitlines()
  assert len(lines) == 1, captured.err
  assert "Traceback" not in captured.err and captured.out == ""
  for fragment in fragments:
    assert fragment in lines[0], lines[0]
  assert not out.exists()
  assert sorted(p.name for p in tmp_path.rglob("*")) == before
  return lines[0]


# --------------------------------------------------------------------------
# One Parquet file = the same CSV
# --------------------------------------------------------------------------


@needs_pyarrow
@pytest.mark.parametrize("kind", ["labels", "names", "correct"])
def test_parquet_gives_the_numbers_of_the_same_csv(tmp_path, capsys, kind):
  data = columns(kind)
  csv = evaluate(tmp_path, capsys, write_csv(tmp_path / "p.csv", data), "--group-by", "site",
                 out="csv")
  parquet = evaluate(tmp_path, capsys, write(tmp_path / "p.parquet", data), "--group-by", "site",
                     out="parquet")
  assert numbers(parquet) == numbers(csv)
  assert parquet["file"] == str(tmp_path / "p.parquet")
  assert parquet["files"] == [str(tmp_path / "p.parquet")]
  assert "Parquet" in parquet["source"]
  assert "Evaluation of p.parquet" in (tmp_path / "parquet" / "report.md").read_text()


@needs_pyarrow
def test_parquet_is_read_into_compact_arrays(tmp_path):
  data = columns("names")
  data["site"] = np.asarray(["north", "south", " east "])[np.arange(N) % 3]
  table = pa.table(data).cast(pa.schema([("y_true", pa.dictionary(pa.int8(), pa.string())),
                                         ("y_pred", pa.large_string()),
                                         ("confidence", pa.float32()),
                                         ("site", pa.string())]))
  path = write_parquet(tmp_path / "p.parquet", table, row_group_size=50)
  loaded = _io.load_predictions(path, group_by="SITE")
  assert loaded.confidences.dtype == np.float32 and loaded.correct.dtype == bool
  assert loaded.labels.dtype == np.int64 and loaded.groups.dtype == np.int64
  np.testing.assert_array_equal(loaded.confidences, data["confidence"].astype(np.float32))
  np.testing.assert_array_equal(loaded.correct, data["y_true"] == data["y_pred"])
  np.testing.assert_array_equal(_io.label_values(loaded), data["y_true"])
  assert loaded.group_names == ("east", "north", "south")
  whole = list(_parquet.iter_parquet_chunks(path))
  small = list(_parquet.iter_parquet_chunks(path, batch_rows=7))
  assert len(small) > len(whole) >= 1
  np.testing.assert_array_equal(np.concatenate([c.confidences for c in small]),
                                np.concatenate([c.confidences for c in whole]))
  assert (small[1].first_line, small[-1].last_line) == (7, N - 1)


@needs_pyarrow
def test_parquet_correct_as_integers_and_extra_columns(tmp_path):
  data = columns("correct")
  table = {"Confidence": data["confidence"], "CORRECT": data["correct"].astype(np.int8),
           "notes": [{"a": 1}] * N}  # a nested column the kit never reads
  loaded = _io.load_predictions(write_parquet(tmp_path / "p.parquet", table))
  np.testing.assert_array_equal(loaded.correct, data["correct"])
  assert loaded.labels is None


# --------------------------------------------------------------------------
# Several inputs = the one file with all the rows
# --------------------------------------------------------------------------


@needs_pyarrow
@pytest.mark.parametrize("kind, suffixes", [
    ("labels", (".parquet", ".parquet", ".parquet")),
    ("names", (".csv", ".csv", ".csv")),
    ("correct", (".csv", ".parquet", ".csv")),
])
def test_three_shards_give_the_numbers_of_the_whole_file(tmp_path, capsys, kind, suffixes):
  data = columns(kind)
  if kind == "names":
    data["y_pred"][:100] = np.where(data["y_pred"][:100] == "fox", "cat", data["y_pred"][:100])
    data["y_true"][:100] = np.where(data["y_true"][:100] == "fox", "dog", data["y_true"][:100])
  whole = evaluate(tmp_path, capsys, write_csv(tmp_path / "whole.csv", data),
                   "--group-by", "site", out="whole")
  shards = [write(tmp_path / f"shard{i}{suffix}", part(data, 100 * i, 100 * (i + 1)))
            for i, suffix in enumerate(suffixes)]
  joined = evaluate(tmp_path, capsys, *shards, "--group-by", "site", out="joined")
  assert numbers(joined) == numbers(whole)
  assert "file" not in joined and joined["files"] == [str(p) for p in shards]
  assert joined["source"].startswith("shard0")
  report = (tmp_path / "joined" / "report.md").read_text()
  assert "shard0" in report and "shard2" in report


@needs_pyarrow
def test_a_folder_and_a_glob_pattern_of_shards(tmp_path, capsys):
  data = columns("labels")
  whole = evaluate(tmp_path, capsys, write_csv(tmp_path / "whole.csv", data), out="whole")
  folder = tmp_path / "shards"
  folder.mkdir()
  for i in range(3):  # sorted by name: part-0, part-1, part-2
    write(folder / f"part-{i}.parquet", part(data, 100 * i, 100 * (i + 1)))
  (folder / "_SUCCESS").write_text("")
  (folder / "part-0.parquet.crc").write_text("not read")
  (folder / ".part-9.parquet").write_text("hidden: not read")
  by_folder = evaluate(tmp_path, capsys, folder, out="folder")
  assert numbers(by_folder) == numbers(whole)
  assert by_folder["files"] == [str(folder / f"part-{i}.parquet") for i in range(3)]
  by_glob = evaluate(tmp_path, capsys, folder / "part-*.parquet", out="glob")
  assert numbers(by_glob) == numbers(whole) and by_glob["files"] == by_folder["files"]


@needs_pyarrow
def test_rows_are_concatenated_in_the_order_given(tmp_path):
  data = columns("names", n=30)
  a = write(tmp_path / "a.parquet", part(data, 0, 10))
  b = write(tmp_path / "b.csv", part(data, 10, 30))
  loaded = _io.load_inputs(_io.expand_inputs([b, a]), group_by="site")
  order = np.r_[10:30, 0:10]
  np.testing.assert_array_equal(loaded.confidences, data["confidence"][order].astype(np.float32))
  np.testing.assert_array_equal(_io.label_values(loaded), data["y_true"][order])
  np.testing.assert_array_equal(np.asarray(loaded.group_names)[loaded.groups],
                                data["site"][order].astype(str))
  assert loaded.group_names == ("2", "7", "10")


def test_npz_shards_with_scores(tmp_path):
  rng = np.random.default_rng(1)
  probs = rng.dirichlet(np.ones(5), 40)
  labels = rng.integers(0, 5, 40)
  for name, rows in (("a", slice(0, 25)), ("b", slice(25, 40))):
    np.savez(tmp_path / f"{name}.npz", probs=probs[rows], labels=labels[rows])
  np.savez(tmp_path / "whole.npz", probs=probs, labels=labels)
  joined = _io.load_inputs([tmp_path / "a.npz", tmp_path / "b.npz"])
  whole = _io.load_predictions(tmp_path / "whole.npz")
  for field in ("confidences", "correct", "scores", "labels"):
    np.testing.assert_array_equal(getattr(joined, field), getattr(whole, field))
  assert joined.num_classes == 5 and not joined.from_logits
  np.savez(tmp_path / "c.npz", probs=rng.dirichlet(np.ones(3), 5), labels=np.zeros(5, int))
  with pytest.raises(UserError, match="c.npz: holds probs over 3 classes.*a.npz holds probs "
                     "over 5 classes"):
    _io.load_inputs([tmp_path / "a.npz", tmp_path / "c.npz"])


@needs_pyarrow
def test_the_output_folder_may_hold_no_input_shard(tmp_path, capsys):
  data = columns("labels")
  (tmp_path / "sub").mkdir()
  a = write(tmp_path / "a.parquet", part(data, 0, 150))
  b = write(tmp_path / "sub" / "b.csv", part(data, 150, N))
  before = sorted(p.name for p in tmp_path.rglob("*"))
  code = cli.main(["evaluate", str(a), str(b), "--out", str(tmp_path / "sub"), "--force", *FAST])
  err = capsys.readouterr().err
  assert code == 2 and "holds the input" in err and "b.csv" in err
  assert sorted(p.name for p in tmp_path.rglob("*")) == before


# --------------------------------------------------------------------------
# Bad inputs: one line naming the file, exit 2, nothing written
# --------------------------------------------------------------------------


@pytest.fixture()
def good(tmp_path):
  """A good Parquet shard of labels (needs pyarrow)."""
  if pa is None:
    pytest.skip("needs pyarrow (the parquet extra)")
  return write(tmp_path / "good.parquet", part(columns("labels"), 0, 100))


def damaged(tmp_path: Path, how: str) -> Path:
  data = part(columns("labels"), 0, 200)
  whole = write_parquet(tmp_path / "whole.bin", data, compression="snappy").read_bytes()
  (tmp_path / "whole.bin").unlink()
  raw = {"half": whole[:len(whole) // 2],
         "no-footer": whole[:-8],
         "garbage": np.random.default_rng(0).bytes(4000),
         "empty": b"",
         "csv-named-parquet": b"y_true,y_pred,confidence\n0,0,0.9\n"}[how]
  path = tmp_path / "bad.parquet"
  path.write_bytes(raw)
  return path


@pytest.mark.parametrize("how", ["half", "no-footer", "garbage", "empty", "csv-named-parquet"])
def test_damaged_parquet(tmp_path, capsys, good, how):
  bad = damaged(tmp_path, how)
  check_bad(tmp_path, capsys, [good, bad], f"{bad}: not a valid Parquet file")
  check_bad(tmp_path, capsys, [bad], f"{bad}: not a valid Parquet file")


@needs_pyarrow
def test_damaged_data_pages(tmp_path, capsys):
  """Garbled compressed pages behind an intact footer are refused, never a traceback."""
  data = part(columns("labels"), 0, 200)
  path = write_parquet(tmp_path / "p.parquet", data, compression="snappy")
  raw = bytearray(path.read_bytes())
  raw[8:len(raw) // 2] = np.random.default_rng(3).bytes(len(raw) // 2 - 8)
  path.write_bytes(bytes(raw))
  check_bad(tmp_path, capsys, [path], f"{path}: ")


@needs_pyarrow
def test_a_flipped_bit_fails_the_page_checksum(tmp_path, capsys):
  """A file written with page checksums is verified: a flipped bit in the labels is refused."""
  path = write_parquet(tmp_path / "p.parquet", part(columns("labels"), 0, 200),
                       compression="none", write_page_checksum=True)
  chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)  # y_true
  raw = bytearray(path.read_bytes())
  raw[chunk.data_page_offset + chunk.total_compressed_size - 4] ^= 1  # in the last page's values
  path.write_bytes(bytes(raw))
  check_bad(tmp_path, capsys, [path], f"{path}: not a valid Parquet file", "checksum")


def bad_table(case: str) -> tuple[dict, str]:
  """A shard that goes wrong (Parquet columns) and the words of its message."""
  data = part(columns("labels"), 100, 200)
  conf = data["confidence"].copy()
  if case == "other-columns":
    return part(columns("correct"), 0, 100), "holds confidence, correct but"
  if case == "missing-column":
    del data["y_pred"]
    return data, "missing column(s) y_pred"
  if case == "missing-group":
    del data["site"]
    return data, "--group-by column 'site' not found"
  if case == "string-confidence":
    data["confidence"] = conf.astype(str)
    return data, "column 'confidence' has type string; expected numbers"
  if case == "bool-confidence":
    data["confidence"] = conf > 0.5
    return data, "column 'confidence' has type bool"
  if case == "names-and-integers":
    data["y_pred"] = np.asarray(NAMES)[data["y_pred"]]
    return data, "class labels must be all integers or all names"
  if case == "class-names":
    data["y_true"], data["y_pred"] = (np.asarray(NAMES)[data[k]] for k in ("y_true", "y_pred"))
    return data, "holds y_true, y_pred, confidence (class names) but"
  if case == "list-labels":
    data["y_true"] = [[int(v)] for v in data["y_true"]]
    return data, "column 'y_true' has type list"
  if case == "nan":
    conf[41] = np.nan
    return {**data, "confidence": conf}, "row 41: confidence nan is not a finite number"
  if case == "inf":
    conf[7] = -np.inf
    return {**data, "confidence": conf}, "row 7: confidence -inf is not a finite number"
  if case == "above-one":
    conf[90] = 1.5
    return {**data, "confidence": conf}, "row 90: confidence 1.5 is outside [0, 1]"
  if case == "below-zero":
    conf[3] = -0.01
    return {**data, "confidence": conf}, "row 3: confidence -0.01 is outside [0, 1]"
  if case == "null":
    table = pa.table(data)
    values = pa.array([None if i == 12 else float(c) for i, c in enumerate(conf)], pa.float64())
    return table.set_column(2, "confidence", values), "row 12: confidence is null"
  if case == "fractional-label":
    data["y_true"] = data["y_true"].astype(float)
    data["y_true"][5] = 1.5
    return data, "row 5: y_true 1.5 is not an integer class label"
  if case == "no-rows":
    return part(data, 0, 0), "no data rows"
  if case == "duplicate-column":
    names = ["y_true", "Y_TRUE", "y_pred", "confidence", "site"]
    arrays = [data["y_true"], data["y_true"], data["y_pred"], data["confidence"], data["site"]]
    return pa.table(arrays, names=names), "duplicate column 'y_true'"
  raise AssertionError(case)


@pytest.mark.parametrize("case", [
    "other-columns", "missing-column", "missing-group", "string-confidence", "bool-confidence",
    "names-and-integers", "class-names", "list-labels", "nan", "inf", "above-one", "below-zero",
    "null", "fractional-label", "no-rows", "duplicate-column"])
def test_bad_parquet_shard(tmp_path, capsys, good, case):
  data, words = bad_table(case)
  bad = write_parquet(tmp_path / "bad.parquet", data, row_group_size=30)
  check_bad(tmp_path, capsys, [good, bad, "--group-by", "site"], f"{bad}: ", words)


@pytest.mark.parametrize("case, words", [
    ("nan", "line 5: confidence 'nan' is not a finite number"),
    ("above-one", "line 4: confidence 1.5 is outside [0, 1]"),
    ("columns", "holds confidence, correct but"),
])
def test_bad_csv_shard(tmp_path, capsys, good, case, words):
  data = part(columns("labels"), 0, 10)
  data["confidence"] = data["confidence"].astype(object)
  if case == "nan":
    data["confidence"][3] = "nan"
  elif case == "above-one":
    data["confidence"][2] = 1.5
  else:
    data = part(columns("correct"), 0, 10)
  bad = write_csv(tmp_path / "bad.csv", data)
  check_bad(tmp_path, capsys, [good, bad], f"{bad}: ", words)


def test_empty_shard_lists(tmp_path, capsys, good):
  empty = tmp_path / "empty"
  empty.mkdir()
  (empty / "notes.txt").write_text("no predictions here")
  check_bad(tmp_path, capsys, [empty], f"{empty}: the folder holds no .csv or .parquet files")
  pattern = tmp_path / "nothing-*.parquet"
  check_bad(tmp_path, capsys, [good, pattern], f"{pattern}: no file matches this pattern")


def test_other_refusals_of_several_inputs(tmp_path, capsys, good):
  check_bad(tmp_path, capsys, [good, tmp_path / "*.parquet"], f"{good}: named twice")
  check_bad(tmp_path, capsys, [good, tmp_path / "missing.parquet"],
            "missing.parquet: file not found")
  np.save(tmp_path / "s.npy", np.full((3, 2), 0.5))
  check_bad(tmp_path, capsys, [tmp_path / "s.npy", good, "--labels", tmp_path / "s.npy"],
            "--labels goes with a single .npy scores file")


def test_missing_pyarrow_names_the_extra(tmp_path, capsys, monkeypatch):
  path = tmp_path / "p.parquet"
  path.write_bytes(b"PAR1 not read PAR1")
  monkeypatch.setitem(sys.modules, "pyarrow", None)
  monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
  check_bad(tmp_path, capsys, [path], f"{path}: reading Parquet needs pyarrow",
            "pip install 'cwsa-jax[parquet]'")


def test_the_parquet_extra():
  with open(Path(__file__).parents[1] / "pyproject.toml", "rb") as f:
    extras = tomllib.load(f)["project"]["optional-dependencies"]
  assert extras["parquet"] == ["pyarrow>=14"]
  assert "parquet" in extras["all"][0] and "cwsa-jax[all]" in extras["dev"]
