"""Four hand-written pieces of the kit against the library way of doing the same thing.

Usage:
  python benchmarks/bench_handwritten.py [--quick] [--only csv,bootstrap,sort,conv]
      [--repeats R] [--min-seconds S] [--max-seconds S]
      [--csv-sizes 1e5,1e6] [--csv-layouts correct,labels,names]
      [--sort-sizes 1e5,1e6,1e7] [--lax-sort-max-n 1e7]
      [--bootstrap-shapes 1000x1e4,200x1e6] [--poisson-shapes 1000x1e4,20x1e6]
      [--conv-batch 128] [--conv-layers all|kinds] [--out results/benchmarks/handwritten.json]

The cases (``component``: what the kit does by hand, and the library way beside it):

* ``csv``: :func:`cwsa_jax.cli._csv.iter_csv_chunks` (pyarrow's parser on blocks of rows
  where pyarrow is installed, NumPy's ``loadtxt`` otherwise, a ``csv``-module fallback for
  the rest), its blocks concatenated, against pyarrow's CSV
  reader producing the same NumPy arrays: ``pyarrow.csv.read_csv`` (its own threads, and
  ``use_threads=False``) and ``pyarrow.csv.open_csv`` (streamed record batches, bounded
  memory as the kit's blocks). Files of n rows in the layouts the CLI reads:
  ``confidence,correct`` (0/1), ``y_true,y_pred,confidence`` with integer labels and with
  class names; written once to a temporary folder (not timed). The pyarrow readers check
  what the kit's fast path checks on a clean file (no nulls, confidence within 1e-6 of
  [0, 1], then clipped; ``correct`` from the kit's true/false words); they do not sniff
  the delimiter, match column names case-insensitively, accept ``1.0`` as an integer
  label, or name the line of a bad cell, as the kit does. Equal: every array identical.
* ``bootstrap``: the kit's resample indices (``_resample_indices``: an unrolled
  Threefry-2x32 block per index from ``fold_in(key, b)``, multiply-shift to [0, n)) against
  ``jax.random.randint`` and ``jax.random.choice`` (replace=True) over
  ``jax.random.split(key, B)``, vmapped and jitted, [B, n] int32; the kit's Poisson(1)
  multiplicities (``_poisson_multiplicities``, rows 0..n-1: one Threefry word per row,
  inverse CDF rounded to 2^-32, values 0..12) against ``jax.random.poisson(k, 1.0, (n,))``
  over split keys. The streams differ, so values are not compared element-wise: each
  result is checked to be in range with the moments of its distribution (mean index
  (n-1)/2, distinct fraction 1-(1-1/n)^n; Poisson mean, variance and P(0) = e^-1, within
  6 standard errors), and a few properties of the streams are measured on the first
  index shape (``bootstrap_semantics``: prefix stability, choice = randint).
* ``sort``: the kit's radix stable order of float32 confidences in [0, 1]
  (``_sort._numpy_stable_order`` of their int32 bit patterns: two stable ``argsort``
  passes of 16-bit digits) against ``np.argsort(c, kind="stable")``, ``np.sort`` of uint64
  (key, position) words (the kit's own stable order where NumPy's AVX-512 sort is fast;
  ``_sort._RADIX_ORDER`` says which one this host's kit uses) and a jitted stable
  ``jax.lax.sort`` of (c, iota) on the CPU (n <= ``--lax-sort-max-n``). Equal: the same
  order, element for element.
* ``conv``: ``training.models.conv_general_dilated`` (``nnx.Conv``'s hook: a custom VJP
  whose filter gradient is one matmul of shifted inputs, for <=
  ``MATMUL_FILTER_GRADIENT_MAX_CHANNELS`` input channels, and an odd channel count padded
  with zeros) against ``jax.lax.conv_general_dilated`` with JAX's own autodiff: a jitted
  ``value_and_grad`` of ``vdot(conv(x, w), g)`` (forward and backward, as in a train
  step) with respect to w (the first layer: the images need no gradient) or x and w, for
  each 3x3 conv layer of the MNIST and CIFAR-10 models of the training configs, batch
  ``--conv-batch``. Layers above the channel limit call lax themselves (the same program,
  a control row). Equal: value and gradients within float32 rounding (max |kit - lax| <=
  2e-5 max |lax|).

Timing: each case's implementations are first run once (the checks; compilation and first
allocations), then called in interleaved rounds in this process (_common.interleaved_times,
each round starting at another implementation): ``--repeats`` rounds, more until the case
has taken ``--min-seconds``, fewer (at least 2) when a round ends past ``--max-seconds``;
minimum and median per implementation. ``ratio`` is kit median / library median (> 1: the
library way is faster), ``ratio_min`` the same of the minima. XLA and pyarrow's
``read_csv`` use every core; NumPy, the kit's CSV reader and ``read_csv(use_threads=False)``
one. Load averages are recorded before and after each case.

Prints a table on stderr and the JSON record on stdout (``--out`` also writes it,
atomically). Exit status 1 when a check failed or a case raised, else 0.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import math
import os
import pkgutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit, interleaved_times, load_average, summarize  # noqa: E402

COMPONENTS = ("csv", "bootstrap", "sort", "conv")
CSV_LAYOUTS = {"correct": ("confidence", "correct"),
               "labels": ("y_true", "y_pred", "confidence"),
               "names": ("y_true", "y_pred", "confidence")}
CLASS_NAMES = np.array(["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                        "ship", "truck"])
CONV_RTOL = 2e-5


# --------------------------------------------------------------------------- rows


def _rows(component: str, what: str, n: int, kit: str, times: dict, libraries: dict,
          load_before, extra: dict | None = None) -> list[dict]:
  """One row per library: ``times`` {name: seconds}; ``libraries`` {name: (equal, ok, note)}."""
  k = summarize(times[kit])
  load_after = load_average()
  rows = []
  for name, (equal, ok, note) in libraries.items():
    lib = summarize(times[name])
    rows.append({
        "component": component, "what": what, "n": n, **(extra or {}),
        "kit": kit, "library": name,
        "kit_min_s": k["min_s"], "kit_median_s": k["median_s"],
        "library_min_s": lib["min_s"], "library_median_s": lib["median_s"],
        "ratio": k["median_s"] / lib["median_s"], "ratio_min": k["min_s"] / lib["min_s"],
        "repeats": min(k["repeats"], lib["repeats"]),
        "equal": equal, "check_ok": bool(ok), "note": note,
        "load_average_before": load_before, "load_average_after": load_after})
  return rows


def _error_row(component: str, what: str, n: int, error: BaseException,
               extra: dict | None = None) -> dict:
  text = "".join(traceback.format_exception_only(type(error), error)).strip()
  return {"component": component, "what": what, "n": n, **(extra or {}), "error": text[-2000:],
          "equal": None, "check_ok": False}


MIN_SECONDS = 0.0  # set by main(): more rounds until a case has taken this long


def _timed(fns: dict, repeats: int, max_seconds: float) -> dict:
  """Interleaved wall times of already-warm ``fns``."""
  return interleaved_times(fns, repeats, max_seconds=max_seconds, min_seconds=MIN_SECONDS)


# --------------------------------------------------------------------------- csv


def write_score_csv(path: Path, layout: str, n: int, seed: int = 0) -> None:
  """n rows of a predictions CSV in ``layout``: 10 classes, confidence ~ U(0.3, 1) float32
  (written in its shortest float32 form), correct with probability c."""
  import pyarrow as pa  # noqa: PLC0415
  import pyarrow.csv as pacsv  # noqa: PLC0415
  rng = np.random.default_rng(seed)
  c = rng.uniform(0.3, 1.0, n).astype(np.float32)
  correct = rng.random(n) < c
  y_true = rng.integers(0, 10, n)
  y_pred = np.where(correct, y_true, (y_true + rng.integers(1, 10, n)) % 10)
  if layout == "correct":
    columns = {"confidence": c, "correct": correct.astype(np.int8)}
  elif layout == "labels":
    columns = {"y_true": y_true, "y_pred": y_pred, "confidence": c}
  else:
    columns = {"y_true": CLASS_NAMES[y_true], "y_pred": CLASS_NAMES[y_pred], "confidence": c}
  with open(path, "wb") as f:
    f.write((",".join(columns) + "\n").encode())
    pacsv.write_csv(pa.table(columns), f, write_options=pacsv.WriteOptions(
        include_header=False, quoting_style="none"))


def kit_read_csv(path: Path) -> dict:
  """The kit's CSV reader, its blocks concatenated: {name: array}."""
  from cwsa_jax.cli._csv import iter_csv_chunks  # noqa: PLC0415
  chunks = list(iter_csv_chunks(path))
  out = {"confidence": np.concatenate([c.confidences for c in chunks]),
         "correct": np.concatenate([c.correct for c in chunks])}
  if chunks[0].y_true is not None:
    out["y_true"] = np.concatenate([c.y_true for c in chunks])
    out["y_pred"] = np.concatenate([c.y_pred for c in chunks])
  return out


def kit_fast_path_only(path: Path) -> bool | None:
  """Whether the kit's fast path (NumPy's parser) takes every block of the file; None where
  ``iter_csv_chunks`` has no ``parsers`` argument to ask it."""
  from cwsa_jax.cli._csv import iter_csv_chunks  # noqa: PLC0415
  try:
    for _ in iter_csv_chunks(path, parsers=("fast",)):
      pass
  except TypeError:
    return None
  except RuntimeError:
    return False
  return True


def _arrow_options(layout: str):
  import pyarrow as pa  # noqa: PLC0415
  import pyarrow.csv as pacsv  # noqa: PLC0415
  from cwsa_jax.cli import _csv  # noqa: PLC0415
  words = lambda ws: sorted({v for w in ws for v in (w, w.upper(), w.capitalize())})  # noqa: E731
  label = pa.int64() if layout == "labels" else pa.string()
  types = {"confidence": pa.float64(), "correct": pa.bool_(), "y_true": label, "y_pred": label}
  names = CSV_LAYOUTS[layout]
  return pacsv.ConvertOptions(include_columns=list(names),
                              column_types={k: types[k] for k in names},
                              true_values=words(_csv._TRUE), false_values=words(_csv._FALSE),
                              strings_can_be_null=False, quoted_strings_can_be_null=False)


def _arrow_arrays(columns: dict, layout: str) -> dict:
  """pyarrow (chunked) arrays to the kit's NumPy arrays, with the fast path's checks."""
  from cwsa_jax.cli._csv import CONFIDENCE_SLACK  # noqa: PLC0415
  for name, col in columns.items():
    if col.null_count:
      raise ValueError(f"{name}: {col.null_count} empty cell(s)")
  conf = columns["confidence"].to_numpy()
  if not (np.all(conf >= -CONFIDENCE_SLACK) and np.all(conf <= 1.0 + CONFIDENCE_SLACK)):
    raise ValueError("confidence outside [0, 1] or not finite")
  out = {"confidence": np.clip(conf, 0.0, 1.0)}
  if layout == "correct":
    out["correct"] = columns["correct"].to_numpy(zero_copy_only=False)
    return out
  if layout == "labels":
    y_true, y_pred = columns["y_true"].to_numpy(), columns["y_pred"].to_numpy()
  else:
    y_true = columns["y_true"].to_numpy(zero_copy_only=False).astype(str)
    y_pred = columns["y_pred"].to_numpy(zero_copy_only=False).astype(str)
  out.update(correct=y_true == y_pred, y_true=y_true, y_pred=y_pred)
  return out


def arrow_read_csv(path: Path, layout: str, use_threads: bool = True) -> dict:
  """``pyarrow.csv.read_csv`` of the layout's columns, whole file at once."""
  import pyarrow.csv as pacsv  # noqa: PLC0415
  table = pacsv.read_csv(path, read_options=pacsv.ReadOptions(use_threads=use_threads),
                         convert_options=_arrow_options(layout))
  return _arrow_arrays({name: table.column(name) for name in CSV_LAYOUTS[layout]}, layout)


def arrow_open_csv(path: Path, layout: str) -> dict:
  """``pyarrow.csv.open_csv``: record batches streamed, each turned into arrays, concatenated."""
  import pyarrow.csv as pacsv  # noqa: PLC0415
  parts = [_arrow_arrays({name: batch.column(name) for name in CSV_LAYOUTS[layout]}, layout)
           for batch in pacsv.open_csv(path, convert_options=_arrow_options(layout))]
  return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}


def _same_arrays(a: dict, b: dict) -> tuple[bool, str]:
  if set(a) != set(b):
    return False, f"columns {sorted(a)} != {sorted(b)}"
  for name in a:
    if a[name].shape != b[name].shape or a[name].dtype.kind != b[name].dtype.kind:
      return False, f"{name}: {a[name].dtype}{a[name].shape} != {b[name].dtype}{b[name].shape}"
    if not np.array_equal(a[name], b[name]):
      return False, f"{name}: {int(np.sum(a[name] != b[name]))} value(s) differ"
  return True, "every array identical (" + ", ".join(
      f"{k} {v.dtype}" for k, v in a.items()) + ")"


def csv_rows(sizes: list[int], layouts: list[str], repeats: int, max_seconds: float) -> list:
  try:
    import pyarrow  # noqa: PLC0415
    import pyarrow.csv  # noqa: F401, PLC0415
  except ImportError:
    return [{"component": "csv", "what": f"csv read: {','.join(CSV_LAYOUTS[layout])} ({layout})",
             "n": n, "skipped": "pyarrow is not installed (pip install 'cwsa-jax[parquet]'): "
                                "no library reader to compare", "equal": None, "check_ok": True}
            for n in sizes for layout in layouts]
  rows = []
  kit = "cwsa_jax.cli._csv.iter_csv_chunks"
  with tempfile.TemporaryDirectory(prefix="bench_handwritten_") as tmp:
    for n in sizes:
      for layout in layouts:
        what = f"csv read: {','.join(CSV_LAYOUTS[layout])} ({layout})"
        path = Path(tmp) / f"{layout}_{n}.csv"
        try:
          write_score_csv(path, layout, n)
          extra = {"file_mb": round(path.stat().st_size / 2**20, 2),
                   "pyarrow": pyarrow.__version__, "pyarrow_cpu_count": pyarrow.cpu_count(),
                   "kit_fast_path_took_every_block": kit_fast_path_only(path)}
          fns = {kit: lambda p=path: kit_read_csv(p),
                 "pyarrow.csv.read_csv": lambda p=path, l=layout: arrow_read_csv(p, l),
                 "pyarrow.csv.read_csv(use_threads=False)":
                     lambda p=path, l=layout: arrow_read_csv(p, l, use_threads=False),
                 "pyarrow.csv.open_csv (streamed batches)":
                     lambda p=path, l=layout: arrow_open_csv(p, l)}
          want = fns[kit]()
          libraries = {}
          for name, fn in fns.items():
            if name != kit:
              equal, detail = _same_arrays(want, fn())
              note = {"pyarrow.csv.read_csv": "whole file, pyarrow's threads",
                      "pyarrow.csv.read_csv(use_threads=False)": "whole file, one thread",
                      }.get(name, "record batches of pyarrow's default block size, one at a time")
              libraries[name] = (equal, equal, f"{note}; {detail}")
          del want
          load_before = load_average()
          times = _timed(fns, repeats, max_seconds)
          rows += _rows("csv", what, n, kit, times, libraries, load_before, extra)
        except Exception as e:  # noqa: BLE001 - recorded, the other cases still run
          rows.append(_error_row("csv", what, n, e))
        finally:
          path.unlink(missing_ok=True)
  return rows


# --------------------------------------------------------------------------- bootstrap


def bootstrap_attr(name: str):
  """``cwsa_jax._bootstrap.<name>``, or the same name in a submodule when ``_bootstrap`` is a
  package that moved it."""
  module = importlib.import_module("cwsa_jax._bootstrap")
  if hasattr(module, name):
    return getattr(module, name)
  for info in pkgutil.walk_packages(getattr(module, "__path__", []), module.__name__ + "."):
    sub = importlib.import_module(info.name)
    if hasattr(sub, name):
      return getattr(sub, name)
  raise ImportError(f"cwsa_jax._bootstrap has no {name} (nor any of its submodules)")


def _index_check(idx: np.ndarray, n: int, num_resamples: int) -> tuple[bool, str]:
  """In range, mean index (n - 1) / 2 and distinct fraction 1 - (1 - 1/n)^n within 6 SE."""
  if idx.shape != (num_resamples, n) or idx.dtype != np.int32:
    return False, f"shape {idx.shape} dtype {idx.dtype}"
  lo, hi = int(idx.min()), int(idx.max())
  if lo < 0 or hi >= n:
    return False, f"indices in [{lo}, {hi}], not in [0, {n})"
  r = min(num_resamples, max(2, -(-2_000_000 // n)))
  part = idx[:r]
  mean = float(part.mean(dtype=np.float64))
  mean_se = n / math.sqrt(12 * part.size)
  distinct = float(np.mean([np.count_nonzero(np.bincount(row, minlength=n)) / n for row in part]))
  expected = 1 - (1 - 1 / n) ** n
  distinct_se = math.sqrt(0.1 / (n * r))
  ok = abs(mean - (n - 1) / 2) <= 6 * mean_se and abs(distinct - expected) <= 6 * distinct_se
  return ok, (f"in [0, n); first {r} resamples: mean index {mean:.1f} (expected {(n - 1) / 2:.1f}"
              f" +- {mean_se:.1f}), distinct fraction {distinct:.4f} (expected {expected:.4f})")


def _poisson_check(m: np.ndarray, n: int, num_resamples: int, max_value: int | None) -> tuple:
  """Non-negative, mean 1, variance 1 and P(0) = e^-1 within 6 SE (and <= max_value)."""
  if m.shape != (num_resamples, n):
    return False, f"shape {m.shape}"
  lo, hi = int(m.min()), int(m.max())
  if lo < 0 or (max_value is not None and hi > max_value):
    return False, f"values in [{lo}, {hi}]"
  r = min(num_resamples, max(2, -(-2_000_000 // n)))
  part = m[:r].astype(np.float64)
  size = part.size
  mean, var, zero = part.mean(), part.var(), float(np.mean(part == 0))
  p0 = math.exp(-1)
  ok = (abs(mean - 1) <= 6 / math.sqrt(size) and abs(var - 1) <= 6 * math.sqrt(3 / size)
        and abs(zero - p0) <= 6 * math.sqrt(p0 * (1 - p0) / size))
  return ok, (f"values in [{lo}, {hi}]; first {r} resamples: mean {mean:.4f}, variance "
              f"{var:.4f}, P(0) {zero:.4f} (Poisson(1): 1, 1, {p0:.4f})")


@functools.lru_cache(maxsize=None)
def _randint_fn(n: int, num_resamples: int):
  return jax.jit(lambda k: jax.vmap(lambda s: jax.random.randint(s, (n,), 0, n))(
      jax.random.split(k, num_resamples)))


@functools.lru_cache(maxsize=None)
def _choice_fn(n: int, num_resamples: int):
  return jax.jit(lambda k: jax.vmap(lambda s: jax.random.choice(s, n, (n,), replace=True))(
      jax.random.split(k, num_resamples)))


@functools.lru_cache(maxsize=None)
def _poisson_fn(n: int, num_resamples: int):
  return jax.jit(lambda k: jax.vmap(lambda s: jax.random.poisson(s, 1.0, (n,), dtype=jnp.int32))(
      jax.random.split(k, num_resamples)))


def bootstrap_semantics(num_resamples: int, n: int) -> dict:
  """Properties of the index streams, measured on [num_resamples, n] (the first shape timed)."""
  resample_indices = bootstrap_attr("_resample_indices")
  key, half = jax.random.key(0), max(1, num_resamples // 2)
  kit = np.asarray(resample_indices(key, n, num_resamples))
  rand = np.asarray(_randint_fn(n, num_resamples)(key))
  return {
      "shape": [num_resamples, n],
      "kit_first_resamples_equal_a_shorter_run": bool(np.array_equal(
          kit[:half], np.asarray(resample_indices(key, n, half)))),
      "randint_over_split_first_resamples_equal_a_shorter_run": bool(np.array_equal(
          rand[:half], np.asarray(_randint_fn(n, half)(key)))),
      "choice_replace_equals_randint_with_the_same_keys": bool(np.array_equal(
          np.asarray(_choice_fn(n, num_resamples)(key)), rand)),
      "kit_equals_randint": bool(np.array_equal(kit, rand)),
      "jax_threefry_partitionable": bool(jax.config.jax_threefry_partitionable),
      "jax_default_prng_impl": str(jax.config.jax_default_prng_impl),
  }


def bootstrap_rows(index_shapes: list, poisson_shapes: list, repeats: int,
                   max_seconds: float) -> tuple[list, dict | None]:
  rows, semantics = [], None
  if index_shapes:
    try:
      semantics = bootstrap_semantics(*index_shapes[0])
    except Exception as e:  # noqa: BLE001
      semantics = {"error": repr(e)}
  key = jax.random.key(0)
  for num_resamples, n in index_shapes:
    what, extra = "bootstrap resample indices [B, n] int32", {"num_resamples": num_resamples}
    try:
      resample_indices = bootstrap_attr("_resample_indices")
      kit = "cwsa_jax._bootstrap._resample_indices"
      randint, choice = _randint_fn(n, num_resamples), _choice_fn(n, num_resamples)
      fns = {kit: lambda n=n, b=num_resamples: resample_indices(key, n, b),
             "jax.random.randint(split(key, B)) vmapped, jit": lambda f=randint: f(key),
             "jax.random.choice(split(key, B), replace=True) vmapped, jit":
                 lambda f=choice: f(key)}
      ok_kit, detail_kit = _index_check(np.asarray(fns[kit]()), n, num_resamples)
      libraries = {}
      for name, fn in fns.items():
        if name != kit:
          ok, detail = _index_check(np.asarray(fn()), n, num_resamples)
          libraries[name] = (
              "not expected: different random streams; "
              + ("both pass their checks" if ok and ok_kit else "a check FAILED"),
              ok and ok_kit, f"kit: {detail_kit}; library: {detail}")
      load_before = load_average()
      times = _timed(fns, repeats, max_seconds)
      rows += _rows("bootstrap", what, n, kit, times, libraries, load_before, extra)
    except Exception as e:  # noqa: BLE001
      rows.append(_error_row("bootstrap", what, n, e, extra))
  for num_resamples, n in poisson_shapes:
    what, extra = "bootstrap Poisson(1) multiplicities [B, n] int32", {
        "num_resamples": num_resamples}
    try:
      poisson_multiplicities = bootstrap_attr("_poisson_multiplicities")
      kit = "cwsa_jax._bootstrap._poisson_multiplicities"
      rows_np = np.arange(n)
      poisson = _poisson_fn(n, num_resamples)
      fns = {kit: lambda r=rows_np, b=num_resamples: poisson_multiplicities(key, r, b),
             "jax.random.poisson(split(key, B), 1.0) vmapped, jit": lambda f=poisson: f(key)}
      ok_kit, detail_kit = _poisson_check(np.asarray(fns[kit]()), n, num_resamples, 12)
      name = "jax.random.poisson(split(key, B), 1.0) vmapped, jit"
      ok, detail = _poisson_check(np.asarray(fns[name]()), n, num_resamples, None)
      libraries = {name: ("not expected: different random streams (the kit's: inverse CDF of "
                          "one Threefry word, P rounded to 2^-32, capped at 12; jax's: Knuth's "
                          "product of uniforms); "
                          + ("both pass their checks" if ok and ok_kit else "a check FAILED"),
                          ok and ok_kit, f"kit: {detail_kit}; library: {detail}")}
      load_before = load_average()
      times = _timed(fns, repeats, max_seconds)
      rows += _rows("bootstrap", what, n, kit, times, libraries, load_before,
                    {**extra, "kit_timed_with": "rows np.arange(n) from the host each call"})
    except Exception as e:  # noqa: BLE001
      rows.append(_error_row("bootstrap", what, n, e, extra))
  return rows, semantics


# --------------------------------------------------------------------------- sort


def sort_data(n: int, seed: int = 0) -> np.ndarray:
  """float32 confidences in [0, 1]: uniform, a tenth on a 0.01 grid (ties), some 0 and 1."""
  rng = np.random.default_rng(seed)
  c = rng.random(n, dtype=np.float32)
  grid = rng.random(n) < 0.1
  c[grid] = np.round(rng.random(int(grid.sum())), 2).astype(np.float32)
  c[rng.random(n) < 0.001] = 0.0
  c[rng.random(n) < 0.001] = 1.0
  return c


def _word_order(keys: np.ndarray) -> np.ndarray:
  """Stable order by ``np.sort`` of uint64 words (key ^ 2^31) << 32 | position."""
  words = (keys.view(np.uint32) ^ np.uint32(0x80000000)).astype(np.uint64) << np.uint64(32)
  words |= np.arange(keys.size, dtype=np.uint64)
  words.sort()
  return (words & np.uint64(0xFFFFFFFF)).astype(np.int64)


def sort_rows(sizes: list[int], lax_sort_max_n: int, repeats: int, max_seconds: float) -> list:
  from cwsa_jax._kernels import _sort  # noqa: PLC0415
  rows = []
  kit = "cwsa_jax._kernels._sort._numpy_stable_order (radix, 2 x 16-bit digits)"
  what = "stable order of float32 confidences in [0, 1]"
  for n in sizes:
    try:
      c = sort_data(n)
      keys = c.view(np.int32)  # = _sort.float_key(c) for c in [0, 1]
      jc = jax.device_put(c)
      lax_order = jax.jit(lambda x: lax.sort((x, lax.iota(jnp.int32, x.shape[0])), num_keys=1,
                                             is_stable=True)[1])
      fns = {kit: lambda: _sort._numpy_stable_order(keys),
             'np.argsort(c, kind="stable")': lambda: np.argsort(c, kind="stable"),
             "np.sort of uint64 (key, position) words": lambda: _word_order(keys)}
      notes = {'np.argsort(c, kind="stable")': "NumPy's stable argsort of the float32 values",
               "np.sort of uint64 (key, position) words":
                   "the kit's own stable order where NumPy's AVX-512 sort is fast (words built "
                   "here in NumPy; the kit builds them in XLA and sorts in XLA's buffer)"}
      if n <= lax_sort_max_n:
        fns["jax.lax.sort((c, iota), is_stable=True), jit, CPU"] = lambda: lax_order(jc)
        notes["jax.lax.sort((c, iota), is_stable=True), jit, CPU"] = (
            "XLA:CPU's stable sort of the float32 values with their positions")
      want = np.asarray(fns[kit]())
      libraries = {}
      for name, fn in fns.items():
        if name != kit:
          got = np.asarray(fn())
          equal = bool(np.array_equal(want, got))
          differ = "" if equal else f"; {int(np.sum(want != got))} positions differ"
          libraries[name] = (equal, equal, notes[name] + differ)
      load_before = load_average()
      times = _timed(fns, repeats, max_seconds)
      rows += _rows("sort", what, n, kit, times, libraries, load_before,
                    {"kit_uses_radix_order_on_this_host": getattr(_sort, "_RADIX_ORDER", None)})
    except Exception as e:  # noqa: BLE001
      rows.append(_error_row("sort", what, n, e))
  return rows


# --------------------------------------------------------------------------- conv


def conv_layers() -> list[dict]:
  """The 3x3 conv layers of the training configs' MNIST and CIFAR-10 models: input size and
  channels, checked against the kernels of the models the configs describe (built
  abstractly: ``nnx.eval_shape``, as ``training.train.create_model`` builds them)."""
  from flax import nnx  # noqa: PLC0415

  from cwsa_jax.training import configs, models  # noqa: PLC0415
  layers = []
  specs = {"mnist": (28, 1, models.MnistCNN, (32, 64), (1, 2)),
           "cifar10": (32, 3, models.Cifar10CNN, (32, 64, 128), (1, 2, 2))}
  for dataset, (size, channels, cls, widths, convs) in specs.items():
    config = configs.get_config(dataset)
    sizes = {k: tuple(v) for k, v in (("widths", config.widths),
                                      ("convs_per_block", config.convs_per_block))
             if v is not None}
    model = nnx.eval_shape(lambda cls=cls, sizes=sizes: cls(num_classes=10,
                                                            rngs=nnx.Rngs(0), **sizes))
    kernels = [tuple(m.kernel.shape) for _, m in nnx.iter_graph(model)
               if isinstance(m, nnx.Conv)]
    derived, ci, hw = [], channels, size
    for width, num in zip(sizes.get("widths", widths), sizes.get("convs_per_block", convs)):
      for _ in range(num):
        derived.append({"model": dataset, "hw": hw, "ci": ci, "co": width,
                        "first": not derived})
        ci = width
      hw //= 2
    if sorted(kernels) != sorted((3, 3, d["ci"], d["co"]) for d in derived):
      raise RuntimeError(f"{dataset}: model kernels {kernels} != derived layers {derived}")
    layers += derived
  return layers


def _conv_loss(conv, x, w, g):
  dn = lax.conv_dimension_numbers(x.shape, w.shape, ("NHWC", "HWIO", "NHWC"))
  return jnp.vdot(conv(x, w, (1, 1), "SAME", dimension_numbers=dn), g)


def _layer_kind(layer: dict, max_channels: int) -> tuple:
  """What decides the kit's path for a layer: custom filter gradient, first layer (no input
  gradient), odd input channels padded."""
  ci = layer["ci"]
  return (ci <= max_channels, layer["first"], ci > 1 and ci % 2 == 1)


def conv_rows(batch: int, repeats: int, max_seconds: float, every_layer: bool = True) -> list:
  """A row per conv layer of the two models (``every_layer``), or per kind of layer
  (:func:`_layer_kind`: the first layer of each kind, for a smoke run)."""
  from cwsa_jax.training import models  # noqa: PLC0415
  rows = []
  kit = "cwsa_jax.training.models.conv_general_dilated (custom VJP)"
  library = "jax.lax.conv_general_dilated + autodiff"
  try:
    layers = conv_layers()
  except Exception as e:  # noqa: BLE001
    return [_error_row("conv", "conv layer value_and_grad", batch, e)]
  if not every_layer:
    kinds = {}
    for layer in layers:
      kinds.setdefault(_layer_kind(layer, models.MATMUL_FILTER_GRADIENT_MAX_CHANNELS), layer)
    layers = list(kinds.values())
  rng = np.random.default_rng(0)
  for layer in layers:
    hw, ci, co = layer["hw"], layer["ci"], layer["co"]
    what = f"conv {layer['model']} {hw}x{hw} {ci}->{co} value_and_grad"
    extra = {"batch": batch, "model": layer["model"], "image": [hw, hw], "in_channels": ci,
             "out_channels": co,
             "grad_wrt": "w" if layer["first"] else "x, w",
             "kit_custom_path": ci <= models.MATMUL_FILTER_GRADIENT_MAX_CHANNELS,
             "odd_channels_padded": bool(models.ODD_CHANNELS_PADDED and ci > 1 and ci % 2)}
    try:
      x = jnp.asarray(rng.standard_normal((batch, hw, hw, ci), np.float32))
      w = jnp.asarray(rng.standard_normal((3, 3, ci, co), np.float32) / math.sqrt(9 * ci))
      g = jnp.asarray(rng.standard_normal((batch, hw, hw, co), np.float32))
      argnums = (1,) if layer["first"] else (0, 1)
      make = lambda conv: jax.jit(jax.value_and_grad(  # noqa: E731
          functools.partial(_conv_loss, conv), argnums=argnums))
      kit_fn, lib_fn = make(models.conv_general_dilated), make(lax.conv_general_dilated)
      forward = jax.make_jaxpr(functools.partial(_conv_loss, models.conv_general_dilated))
      extra["kit_program_has_custom_vjp"] = "custom_vjp_call" in str(forward(x, w, g))
      fns = {kit: lambda: kit_fn(x, w, g), library: lambda: lib_fn(x, w, g)}
      got, want = fns[kit](), fns[library]()
      errors = []
      for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        errors.append(float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)))
      names = ["value"] + (["dw"] if layer["first"] else ["dx", "dw"])
      ok = max(errors) <= CONV_RTOL
      errors_text = ", ".join(f"{k} {e:.1e}" for k, e in zip(names, errors))
      if ok:
        equal = (f"within float32 rounding: max |kit - lax| / max |lax| {errors_text} "
                 f"(<= {CONV_RTOL:g})")
      else:
        equal = f"DIFFERENT: max |kit - lax| / max |lax| {errors_text} (> {CONV_RTOL:g})"
      if extra["kit_program_has_custom_vjp"]:
        note = ("kit: lax's forward and input gradient, the filter gradient one matmul of the 9 "
                "shifted inputs" + ("; the odd input channels padded with a zero channel"
                                    if extra["odd_channels_padded"] else ""))
      else:
        note = (f"control: {ci} input channels > MATMUL_FILTER_GRADIENT_MAX_CHANNELS, the hook "
                "calls lax.conv_general_dilated itself (the same program)")
      del got, want
      load_before = load_average()
      times = _timed(fns, repeats, max_seconds)
      rows += _rows("conv", what, batch, kit, times, {library: (equal, ok, note)}, load_before,
                    extra)
    except Exception as e:  # noqa: BLE001
      rows.append(_error_row("conv", what, batch, e, extra))
  return rows


# --------------------------------------------------------------------------- main


def _sizes(text: str) -> list[int]:
  return [int(float(s)) for s in text.split(",") if s.strip()]


def _shapes(text: str) -> list[tuple[int, int]]:
  out = []
  for item in text.split(","):
    if item.strip():
      b, n = item.lower().split("x")
      out.append((int(float(b)), int(float(n))))
  return out


def table_line(row: dict) -> str:
  head = f"{row['what'][:52]:<52} {row['n']:>9}"
  if "skipped" in row:
    return f"{head}  SKIPPED {row['skipped']}"
  if "error" in row:
    return f"{head}  ERROR {row['error'].splitlines()[-1][:100]}"
  verdict = "ok" if row["check_ok"] else "CHECK FAILED"
  return (f"{head} {row['kit_median_s'] * 1e3:>10.2f} {row['library'][:52]:<52} "
          f"{row['library_median_s'] * 1e3:>10.2f} {row['ratio']:>7.2f}  {verdict}")


def summary(rows: list) -> dict:
  timed = [r for r in rows if "ratio" in r]
  return {
      "rows": len(rows),
      "rows_timed": len(timed),
      "checks_failed": [{k: r.get(k) for k in ("component", "what", "n", "library", "equal")}
                        for r in rows if not r["check_ok"] and "error" not in r],
      "errors": [{k: r[k] for k in ("component", "what", "n", "error")}
                 for r in rows if "error" in r],
      "skipped": [{k: r[k] for k in ("component", "what", "n", "skipped")}
                  for r in rows if "skipped" in r],
      "library_faster": [{k: r[k] for k in ("component", "what", "n", "library", "ratio")}
                         for r in timed if r["ratio"] > 1.0],
  }


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="a smoke run: tiny sizes, 2 repeats")
  parser.add_argument("--only", default=None, help=f"comma-separated: {', '.join(COMPONENTS)}")
  parser.add_argument("--repeats", type=int, default=None,
                      help="interleaved rounds per case (default 5; 2 with --quick); more until "
                           "--min-seconds, fewer once --max-seconds have passed")
  parser.add_argument("--max-seconds", type=float, default=None,
                      help="stop a case's rounds after the one that passes this (at least 2 "
                           "rounds; default 8; 2 with --quick)")
  parser.add_argument("--min-seconds", type=float, default=None,
                      help="more rounds until a case has taken this long (default 1; 0 with "
                           "--quick): fast cases get more samples")
  parser.add_argument("--csv-sizes", default=None, help="rows (default 1e5,1e6)")
  parser.add_argument("--csv-layouts", default=",".join(CSV_LAYOUTS),
                      help=f"comma-separated: {', '.join(CSV_LAYOUTS)}")
  parser.add_argument("--sort-sizes", default=None, help="n (default 1e5,1e6,1e7)")
  parser.add_argument("--lax-sort-max-n", type=float, default=1e7,
                      help="time jax.lax.sort up to this n")
  parser.add_argument("--bootstrap-shapes", default=None,
                      help="BxN resample-index matrices (default 1000x1e4,200x1e6)")
  parser.add_argument("--poisson-shapes", default=None,
                      help="BxN Poisson multiplicity matrices (default 1000x1e4,20x1e6: "
                           "jax.random.poisson is far slower per value than randint)")
  parser.add_argument("--conv-batch", type=int, default=None, help="batch (default 128)")
  parser.add_argument("--conv-layers", choices=("all", "kinds"), default=None,
                      help="every conv layer of the two models, or the first of each kind "
                           "(custom or lax filter gradient, first layer, odd channels; default "
                           "all; kinds with --quick)")
  parser.add_argument("--out", default=None, help="also write the JSON here (atomically)")
  args = parser.parse_args(argv)
  only = COMPONENTS if args.only is None else tuple(o.strip() for o in args.only.split(","))
  unknown = sorted(set(only) - set(COMPONENTS))
  if unknown:
    parser.error(f"unknown component(s) {unknown}; choose from {', '.join(COMPONENTS)}")
  layouts = [s.strip() for s in args.csv_layouts.split(",") if s.strip()]
  if set(layouts) - set(CSV_LAYOUTS):
    parser.error(f"unknown CSV layout(s) {sorted(set(layouts) - set(CSV_LAYOUTS))}")
  q = args.quick
  repeats = args.repeats or (2 if q else 5)
  max_seconds = args.max_seconds if args.max_seconds is not None else (2.0 if q else 8.0)
  global MIN_SECONDS
  MIN_SECONDS = args.min_seconds if args.min_seconds is not None else (0.0 if q else 1.0)
  csv_sizes = _sizes(args.csv_sizes or ("2000" if q else "1e5,1e6"))
  sort_sizes = _sizes(args.sort_sizes or ("3000" if q else "1e5,1e6,1e7"))
  index_shapes = _shapes(args.bootstrap_shapes or ("20x500" if q else "1000x1e4,200x1e6"))
  poisson_shapes = _shapes(args.poisson_shapes or ("20x500" if q else "1000x1e4,20x1e6"))
  conv_batch = args.conv_batch or (4 if q else 128)
  conv_layers_choice = args.conv_layers or ("kinds" if q else "all")

  load_before = load_average()
  header = (f"{'case':<52} {'n':>9} {'kit ms':>10} {'library':<52} {'ms':>10} {'ratio':>7}  "
            "check  (medians; ratio = kit / library)")
  print(header, file=sys.stderr, flush=True)
  rows, table, semantics = [], [header], None

  def add(new_rows: list) -> None:
    for row in new_rows:
      rows.append(row)
      table.append(table_line(row))
      print(table[-1], file=sys.stderr, flush=True)

  wall = {}

  def component(name: str, run) -> None:
    if name in only:
      start = time.perf_counter()
      add(run())
      wall[name] = round(time.perf_counter() - start, 2)

  def bootstrap() -> list:
    nonlocal semantics
    new_rows, semantics = bootstrap_rows(index_shapes, poisson_shapes, repeats, max_seconds)
    return new_rows

  component("csv", lambda: csv_rows(csv_sizes, layouts, repeats, max_seconds))
  component("bootstrap", bootstrap)
  component("sort", lambda: sort_rows(sort_sizes, int(args.lax_sort_max_n), repeats, max_seconds))
  component("conv", lambda: conv_rows(conv_batch, repeats, max_seconds,
                                      every_layer=conv_layers_choice == "all"))

  s = summary(rows)
  payload = {
      "settings": {"quick": q, "components": list(only), "repeats": repeats,
                   "max_seconds": max_seconds, "min_seconds": MIN_SECONDS,
                   "csv_sizes": csv_sizes, "csv_layouts": layouts,
                   "sort_sizes": sort_sizes, "lax_sort_max_n": int(args.lax_sort_max_n),
                   "bootstrap_shapes": index_shapes, "poisson_shapes": poisson_shapes,
                   "conv_batch": conv_batch, "conv_layers": conv_layers_choice,
                   "timing": "each implementation run once (the checks, compilation), then "
                             "interleaved rounds (`repeats`, more until `min_seconds`, at least "
                             "2 and none after the round that passes `max_seconds`); min and "
                             "median; ratio = kit median / library median",
                   "threads": "XLA and pyarrow.csv.read_csv use every core; NumPy, the kit's CSV "
                              "reader and read_csv(use_threads=False) one"},
      "bootstrap_semantics": semantics,
      "component_wall_s": wall,
      "load_average_before": load_before,
      "load_average_after": load_average(),
      "cases": rows,
      "summary": s,
  }
  lines = [f"checks failed: {len(s['checks_failed'])}, errors: {len(s['errors'])}, "
           f"skipped: {len(s['skipped'])}"]
  lines += [f"  CHECK FAILED {c['what']} n={c['n']} vs {c['library']}: {c['equal']}"
            for c in s["checks_failed"]]
  lines += [f"  ERROR {e['what']} n={e['n']}: {e['error'].splitlines()[-1][:200]}"
            for e in s["errors"]]
  emit("handwritten", payload, table=lines, out=args.out)
  return 1 if s["checks_failed"] or s["errors"] else 0


if __name__ == "__main__":
  sys.exit(main())
