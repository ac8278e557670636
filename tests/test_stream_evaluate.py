"""``cwsa-jax evaluate --stream``: CSV and Parquet read in chunks give the in-memory numbers.

The sweep, accuracy, ECE, AUMCC and the deployment threshold equal the in-memory evaluation's
exactly (the same metrics.json values); AURC, AUGRC and E-AURC, computed exactly from a second
read of the files, agree to float32 precision (relative 1e-6) and with the float64 references
of ``reference.py`` to float64 rounding. Whatever --stream cannot do is refused with exit
status 2 and one line; a file that changes between the passes is refused and nothing is written.
"""

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import reference as ref

import cwsa_jax as cw
from cwsa_jax import cli
from cwsa_jax.cli import _stream
from cwsa_jax.cli._settings import Settings
from cwsa_jax.cli._util import UserError

N = 1000
AREAS = ("aurc", "augrc", "eaurc")
FAST = ["--no-figures", "--no-progress", "--bootstrap", "0"]  # a later --bootstrap N wins


def data(kind: str, n: int = N, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """float32 confidences and bool correctness: ``random`` (all distinct), ``ties`` (two
  decimals, with 0 and 1), ``all_correct``, ``all_wrong``."""
  rng = np.random.default_rng(seed)
  c = rng.beta(4.0, 1.5, n).astype(np.float32)
  if kind == "ties":
    c = np.round(c, 2).astype(np.float32)
    c[:2] = [0.0, 1.0]
  ok = rng.random(n) < c
  if kind == "all_correct":
    ok[:] = True
  elif kind == "all_wrong":
    ok[:] = False
  return c, ok


def write(path: Path, c: np.ndarray, ok: np.ndarray, labels: bool = False) -> Path:
  """A predictions CSV or Parquet file (by extension) with ``confidence,correct``, or with
  ``y_true,y_pred,confidence`` when ``labels``."""
  if labels:
    y_true = np.arange(c.size) % 3
    columns = {"y_true": y_true, "y_pred": np.where(ok, y_true, (y_true + 1) % 3), "confidence": c}
  else:
    columns = {"confidence": c, "correct": ok}
  if path.suffix == ".parquet":
    pq.write_table(pa.table(columns), path, row_group_size=max(1, c.size // 3))
  else:
    names = list(columns)
    rows = np.column_stack([np.asarray(columns[k], np.float64) for k in names])
    fmt = ["%d" if k != "confidence" else "%.9g" for k in names]
    np.savetxt(path, rows, fmt=fmt, delimiter=",", header=",".join(names), comments="")
  return path


def run(capsys, *argv) -> tuple[int, str, str]:
  code = cli.main([str(a) for a in argv])
  captured = capsys.readouterr()
  return code, captured.out, captured.err


def evaluate(capsys, out: Path, files, *extra) -> dict:
  files = files if isinstance(files, (list, tuple)) else [files]
  code, _, err = run(capsys, "evaluate", *files, "--out", out, *FAST, *extra)
  assert code == 0, err
  return json.loads((out / "metrics.json").read_text())


def assert_same_metrics(streamed: dict, in_memory: dict) -> None:
  """Every key of the in-memory metrics.json equal in the streamed one (AURC family to 1e-6)."""
  assert streamed.pop("streaming")["aurc_exact"] is True
  in_memory.pop("classes", None)
  assert set(streamed) == set(in_memory)
  aurc = in_memory["aurc"]
  for name in AREAS:
    a, b = streamed.pop(name), in_memory.pop(name)
    # E-AURC = AURC - oracle: compared to the AURC's precision (float32 cancellation).
    scale = max(abs(b), aurc if name == "eaurc" else 0.0, 1e-30)
    assert abs(a - b) <= 1e-6 * scale, (name, a, b)
  assert streamed == in_memory


def one_line_error(capsys, *argv) -> str:
  code, _, err = run(capsys, *argv)
  assert code == 2
  lines = err.strip().splitlines()
  assert len(lines) == 1, err
  return lines[0]


# --------------------------------------------------------------------------
# Streaming equals in memory
# --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["random", "ties", "all_correct", "all_wrong"])
@pytest.mark.parametrize("ext,chunk_rows", [(".csv", 1), (".csv", 333), (".parquet", 64),
                                            (".parquet", 5000)])
def test_stream_equals_in_memory(tmp_path, capsys, kind, ext, chunk_rows):
  path = write(tmp_path / f"p{ext}", *data(kind))
  in_memory = evaluate(capsys, tmp_path / "mem", path, "--bootstrap", "0")
  streamed = evaluate(capsys, tmp_path / "stream", path, "--stream", "--chunk-rows", chunk_rows)
  assert streamed["streaming"]["chunk_rows"] == chunk_rows
  assert_same_metrics(streamed, in_memory)


@pytest.mark.parametrize("convention", ["step", "trapezoid"])
def test_several_passes_give_the_same_numbers(tmp_path, capsys, monkeypatch, convention):
  """A tiny sort budget makes AURC take many passes (bins sorted apart), with equal results
  (tiny slices of tie groups: test_exact_areas_match_the_float64_reference)."""
  path = write(tmp_path / "p.csv", *data("random"))
  aurc = ["--aurc", convention]
  in_memory = evaluate(capsys, tmp_path / "mem", path, "--bootstrap", "0", *aurc)
  monkeypatch.setenv(_stream.SORT_ROWS_ENV, "40")
  streamed = evaluate(capsys, tmp_path / "stream", path, "--stream", "--chunk-rows", 300, *aurc)
  passes = streamed["streaming"]["passes"]
  assert passes > 3
  assert streamed["streaming"]["distinct_confidences"] == np.unique(data("random")[0]).size
  assert_same_metrics(streamed, in_memory)
  assert f"exactly in {passes} passes" in (tmp_path / "stream" / "report.md").read_text()


def test_single_row(tmp_path, capsys):
  path = write(tmp_path / "one.csv", np.array([0.7], np.float32), np.array([False]))
  in_memory = evaluate(capsys, tmp_path / "mem", path, "--bootstrap", "0")
  streamed = evaluate(capsys, tmp_path / "stream", path, "--stream")
  assert streamed["streaming"]["passes"] == 1
  assert_same_metrics(streamed, in_memory)


def test_shards_in_a_folder_and_labels(tmp_path, capsys, monkeypatch):
  """CSV and Parquet shards with class labels: the same metrics as in memory; the per-class
  breakdown is left out with a note."""
  c, ok = data("ties", n=999, seed=3)
  folder = tmp_path / "shards"
  folder.mkdir()
  for i, ext in enumerate([".csv", ".parquet", ".csv"]):
    write(folder / f"part{i}{ext}", c[i * 333:(i + 1) * 333], ok[i * 333:(i + 1) * 333],
          labels=True)
  in_memory = evaluate(capsys, tmp_path / "mem", folder, "--bootstrap", "0")
  assert "classes" in in_memory
  monkeypatch.setenv(_stream.SORT_ROWS_ENV, "100")
  streamed = evaluate(capsys, tmp_path / "stream", folder, "--stream", "--chunk-rows", 100)
  assert streamed["streaming"]["omitted"] == ["classes"]
  assert_same_metrics(streamed, in_memory)
  assert "per-class breakdown is left out" in (tmp_path / "stream" / "report.md").read_text()


def test_select_on_gives_the_in_memory_choice(tmp_path, capsys):
  path = write(tmp_path / "test.parquet", *data("random", seed=4))
  selection = write(tmp_path / "val.csv", *data("ties", seed=5))
  extra = ["--select-on", selection, "--min-coverage", "0.6"]
  in_memory = evaluate(capsys, tmp_path / "mem", path, "--bootstrap", "0", *extra)
  streamed = evaluate(capsys, tmp_path / "stream", path, "--stream", *extra)
  assert streamed["threshold_choice"]["evaluated"]["coverage"] > 0
  assert_same_metrics(streamed, in_memory)


@pytest.mark.parametrize("convention", ["step", "trapezoid"])
@pytest.mark.parametrize("kind", ["random", "ties"])
def test_exact_areas_match_the_float64_reference(tmp_path, kind, convention):
  """Pass 2's areas equal the float64 references to float64 rounding, whatever the budget
  and the slices its tie groups are summed in."""
  c, ok = data(kind, n=600, seed=7)
  paths = [write(tmp_path / "p.csv", c, ok)]
  scanned = _stream.scan(paths, Settings(), 128)
  expected = [ref.aurc(c, ok, convention), ref.aurc(c, ok, convention, generalized=True),
              ref.eaurc(c, ok, convention)]
  in_memory = cw.risk_coverage_summary(c, ok, convention=convention)
  for budget, group_slice in [(1, 1), (50, 7), (10**9, 3), (10**9, 1 << 18)]:
    summary, passes, _ = _stream.exact_areas(paths, scanned, convention, 128, budget=budget,
                                             group_slice=group_slice)
    assert passes >= 1
    np.testing.assert_allclose(summary, expected, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(summary[:2], np.asarray(in_memory[:2], np.float64), rtol=1e-6)


def test_tie_groups_of_packed_keys():
  packed = np.array([(5 << 1) | 1, 3 << 1, (5 << 1), (3 << 1) | 1, (3 << 1) | 1, 9 << 1], np.uint32)
  keys, counts, errors = _stream.tie_groups(np.sort(packed))
  assert keys.tolist() == [9, 5, 3] and counts.tolist() == [1, 2, 3]
  assert errors.tolist() == [0, 1, 2]


# --------------------------------------------------------------------------
# Outputs, progress, flags
# --------------------------------------------------------------------------


def test_figures_and_progress(tmp_path, capsys, monkeypatch):
  monkeypatch.setenv("CWSA_JAX_PROGRESS", "1")
  monkeypatch.setenv(_stream.SORT_ROWS_ENV, "400")
  path = write(tmp_path / "p.csv", *data("random"))
  out = tmp_path / "out"
  code, stdout, err = run(capsys, "evaluate", path, "--stream", "--bootstrap", "0", "--out", out)
  assert code == 0, err
  passes = json.loads((out / "metrics.json").read_text())["streaming"]["passes"]
  assert passes > 2 and f"computed exactly in {passes} passes" in stdout
  shown = {part.split(":")[0] for part in err.replace("\r", "\n").split("\n")}
  assert {"pass 1", f"pass 2/{passes}", f"pass {passes}/{passes}"} <= shown
  for name in ("threshold_curves.png", "reliability_diagram.png", "risk_coverage.png"):
    assert (out / name).stat().st_size > 0
  assert "drawn from the streamed confidence histogram (binned)" in (out / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("convention", ["step", "trapezoid"])
def test_stream_intervals_equal_in_memory(tmp_path, capsys, monkeypatch, convention):
  """Poisson intervals over several bootstrap passes and two files (rows numbered across
  the files): the in-memory evaluation's intervals."""
  monkeypatch.setenv(_stream.SORT_ROWS_ENV, "300")
  folder = tmp_path / "shards"
  folder.mkdir()
  c, ok = data("ties")
  write(folder / "a.csv", c[:400], ok[:400])
  write(folder / "b.parquet", c[400:], ok[400:])
  extra = ["--bootstrap", "200", "--seed", "3", "--aurc", convention]
  in_memory = evaluate(capsys, tmp_path / "mem", folder, *extra)
  streamed = evaluate(capsys, tmp_path / "str", folder, "--stream", "--chunk-rows", "97", *extra)
  assert streamed["streaming"]["bootstrap_passes"] >= 4
  a, b = streamed["intervals"], in_memory["intervals"]
  assert a["resampling"] == b["resampling"] == "poisson" and a["num_resamples"] == 200
  # The streamed bootstrap (cwsa_jax._bootstrap._streamed) does not resample the peer metrics
  # yet: --stream reports them with null intervals and a note.
  unresampled = {"auroc", "fpr_at_95tpr", "average_precision_success",
                 "average_precision_error", "smooth_ece"}
  assert "--stream" in a["note"]
  for end in ("low", "high"):
    assert set(a[end]) == set(b[end])
    assert all(a[end][name] is None for name in unresampled)
    for name in set(b[end]) - unresampled:
      np.testing.assert_allclose(a[end][name], b[end][name], atol=3e-7, rtol=0,
                                 err_msg=f"{end} {name}")


@pytest.mark.parametrize("extra,needle", [
    (["--bootstrap", "200", "--resampling", "multinomial"], "--resampling multinomial"),
    (["--bootstrap", "20"], "too few resamples"),
    (["--chunk-rows", "0"], "--chunk-rows must be >= 1"),
    (["--binning", "mass"], "--binning mass"),
    (["--worst", "3"], "--worst"),
    (["--group-by", "site"], "--group-by"),
    (["--aurc", "published_code"], "published_code"),
    (["--published-code"], "published_code"),
])
def test_refused_flags(tmp_path, capsys, extra, needle):
  path = write(tmp_path / "p.csv", *data("ties", n=20))
  line = one_line_error(capsys, "evaluate", path, "--stream", "--out", tmp_path / "o", *FAST,
                        *extra)
  assert needle in line
  assert not (tmp_path / "o").exists()


def test_chunk_rows_needs_stream(tmp_path, capsys):
  path = write(tmp_path / "p.csv", *data("ties", n=20))
  assert "--chunk-rows goes with --stream" in one_line_error(
      capsys, "evaluate", path, "--chunk-rows", "5", "--out", tmp_path / "o", *FAST)


# --------------------------------------------------------------------------
# Bad inputs: one line naming the file, exit 2, nothing written
# --------------------------------------------------------------------------


def test_npz_input_is_refused(tmp_path, capsys):
  path = tmp_path / "p.npz"
  np.savez(path, confidences=np.array([0.5, 0.9]), correct=np.array([True, False]))
  line = one_line_error(capsys, "evaluate", path, "--stream", "--out", tmp_path / "o", *FAST)
  assert str(path) in line and "CSV and Parquet" in line


@pytest.mark.parametrize("ext", [".csv", ".parquet"])
def test_bad_confidence_names_the_file(tmp_path, capsys, ext):
  c, ok = data("ties", n=50)
  c[37] = np.nan if ext == ".csv" else 1.5
  good = write(tmp_path / f"a{ext}", *data("ties", n=50))
  bad = write(tmp_path / f"b{ext}", c, ok)
  line = one_line_error(capsys, "evaluate", good, bad, "--stream", "--chunk-rows", 7,
                        "--out", tmp_path / "o", *FAST)
  assert str(bad) in line
  assert not (tmp_path / "o").exists()


def test_shards_with_different_columns_are_refused(tmp_path, capsys):
  c, ok = data("ties", n=30)
  a = write(tmp_path / "a.csv", c, ok)
  b = write(tmp_path / "b.parquet", c, ok, labels=True)
  line = one_line_error(capsys, "evaluate", a, b, "--stream", "--out", tmp_path / "o", *FAST)
  assert str(b) in line and "same columns" in line


def test_file_changed_between_passes(tmp_path, capsys, monkeypatch):
  """The file is rewritten after pass 1: one line naming it, exit 2, no output folder."""
  path = write(tmp_path / "p.csv", *data("random", n=200))
  scan = _stream.scan

  def scan_then_change(paths, *args, **kwargs):
    result = scan(paths, *args, **kwargs)
    write(path, *data("random", n=201, seed=9))
    return result

  monkeypatch.setattr(_stream, "scan", scan_then_change)
  line = one_line_error(capsys, "evaluate", path, "--stream", "--out", tmp_path / "o", *FAST)
  assert str(path) in line and "changed between the passes" in line
  assert not (tmp_path / "o").exists()


def test_rows_changed_with_the_same_size_and_time(tmp_path):
  """Same size and modification time but other rows: the row count gives it away."""
  path = tmp_path / "p.csv"
  path.write_text("confidence,correct\n" + "0.90001,1\n0.90002,0\n" * 2)  # one key bin
  paths = [path]
  scanned = _stream.scan(paths, Settings(), 2)
  stat = path.stat()
  path.write_text("confidence,correct\n" + "0.90001,1\n" * 3 + "\n" * 10)  # 3 rows, same size
  assert path.stat().st_size == stat.st_size
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  with pytest.raises(UserError, match="3 rows now, 4 on the first pass"):
    _stream.exact_areas(paths, scanned, "step", 2, budget=1)
