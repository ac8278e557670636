"""``cwsa-jax evaluate`` (and ``compare``) end to end on large CSV and Parquet files: wall time
and peak memory.

Usage: python benchmarks/bench_evaluate.py [--rows 2e6,5e6] [--formats csv,parquet]
       [--bootstrap 1000] [--commands evaluate,compare] [--out results/benchmarks/evaluate.json]

Each file (``y_true,y_pred,confidence``, 10 classes, about 80% accuracy,
confidence ~ U(0.3, 1) and correct with probability c; seed 0) is written to
a temporary folder, then ``cwsa-jax evaluate FILE`` runs in a fresh process
with the default settings (the 50-threshold sweep, ECE, AURC family, the
per-class breakdown, ``--bootstrap`` resamples of every interval, the figures)
and ``--no-progress``. Recorded per file: the file's size, the wall time of
the whole command (interpreter start and JAX compilation included) and the
peak RSS of that process (``ru_maxrss`` of the child). The goals of issue 13:
a 5M-row CSV in <= 60 s and a 2M-row one in <= 30 s with default intervals.
``compare`` runs ``cwsa-jax compare FILE FILE_B`` with the same flags, where
FILE_B holds another model's predictions of the same test set (same labels,
its own confidences and correctness).

The children inherit the caller's environment, JAX's persistent compilation
cache settings included. ``--cache-compare`` runs each command three times
instead: with JAX's persistent compilation cache off, then with an empty
cache folder of its own (``JAX_COMPILATION_CACHE_DIR``, every program written:
``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0``), then again with that folder
filled: what a user who sets those two variables saves on every later run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit, load_average  # noqa: E402


def write_file(path: Path, n: int, model: int = 0) -> None:
  rng = np.random.default_rng(0)
  c = rng.uniform(0.3, 1.0, n).astype(np.float32)
  y_true = rng.integers(0, 10, n)
  if model:  # another model's predictions of the same test set
    rng = np.random.default_rng(model)
    c = rng.uniform(0.3, 1.0, n).astype(np.float32)
  correct = rng.random(n) < c
  y_pred = np.where(correct, y_true, (y_true + rng.integers(1, 10, n)) % 10)
  if path.suffix == ".parquet":
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415
    pq.write_table(pa.table({"y_true": y_true, "y_pred": y_pred, "confidence": c}), path)
    return
  with open(path, "w") as f:
    f.write("y_true,y_pred,confidence\n")
    for start in range(0, n, 1_000_000):
      stop = min(n, start + 1_000_000)
      block = np.column_stack([y_true[start:stop], y_pred[start:stop]]).astype(str)
      conf = np.char.mod("%.6f", c[start:stop])
      f.write("\n".join(f"{a},{b},{x}" for (a, b), x in zip(block, conf)) + "\n")


# JAX's persistent compilation cache: its environment variables (jax.config reads them at import).
_CACHE_VARIABLES = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                    "JAX_ENABLE_COMPILATION_CACHE")


def cache_environment(folder: Path | None) -> dict:
  """The caller's environment with JAX's compilation cache off (``folder`` None) or in ``folder``,
  every compiled program written to it."""
  env = {k: v for k, v in os.environ.items() if k not in _CACHE_VARIABLES}
  if folder is None:
    env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
  else:
    env.update(JAX_COMPILATION_CACHE_DIR=str(folder), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  return env


def run_command(argv: list, bootstrap: int, env: dict | None = None) -> dict:
  """Runs ``cwsa-jax argv`` in a child (environment ``env``, default the caller's); its own peak
  RSS comes from ``os.wait4``."""
  with tempfile.TemporaryFile("w+") as err:
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "cwsa_jax.cli", *map(str, argv), "--bootstrap",
                             str(bootstrap), "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=err, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err.seek(0)
    row = {"exit": proc.returncode, "wall_s": wall, "peak_rss_mb": usage.ru_maxrss / 1024}
    if proc.returncode != 0:
      row["stderr"] = err.read()[-2000:]
  return row


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", default="2e6,5e6")
  parser.add_argument("--formats", default="csv,parquet")
  parser.add_argument("--bootstrap", type=int, default=1000)
  parser.add_argument("--commands", default="evaluate,compare")
  parser.add_argument("--cache-compare", action="store_true",
                      help="run each command with JAX's compilation cache off, cold and warm")
  parser.add_argument("--out", default=None)
  args = parser.parse_args(argv)
  commands = args.commands.split(",")
  payload = {"load_average_before": load_average(),
             "settings": {"bootstrap": args.bootstrap, "command": "cwsa-jax evaluate FILE --bootstrap B "
                          "--no-progress (defaults otherwise: figures, per-class breakdown)",
                          "compare": "cwsa-jax compare FILE FILE_B --bootstrap B --no-progress "
                          "(defaults otherwise)"},
             "rows": []}
  sizes = sorted(int(float(s)) for s in args.rows.split(","))
  with tempfile.TemporaryDirectory() as tmp:
    for n in sizes:
      for fmt in args.formats.split(","):
        path, other = Path(tmp) / f"pred-{n}.{fmt}", Path(tmp) / f"pred-{n}-b.{fmt}"
        write_file(path, n)
        runs = {"evaluate": lambda label: ["evaluate", path, "--out",
                                           Path(tmp) / f"out-{n}-{fmt}-{label}"],
                "compare": lambda label: ["compare", path, other]}
        if "compare" in commands:
          write_file(other, n, model=1)
        for command in commands:
          cache = Path(tmp) / f"jax-cache-{n}-{fmt}-{command}"
          settings = ((("off", cache_environment(None)), ("cold", cache_environment(cache)),
                       ("warm", cache_environment(cache))) if args.cache_compare else
                      (("caller", None),))
          for label, env in settings:
            row = {"command": command, "rows": n, "format": fmt, "compilation_cache": label,
                   "file_mb": path.stat().st_size / 1e6,
                   **run_command(runs[command](label), args.bootstrap, env)}
            if label != "caller":
              row["cache_files"] = len(list(cache.iterdir())) if cache.is_dir() else 0
            payload["rows"].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        for p in (path, other):
          p.unlink(missing_ok=True)
  payload["load_average_after"] = load_average()
  emit("evaluate_end_to_end", payload, out=args.out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
