"""The measured points of the README's scale plan: state throughput, state sizes, a 2-process merge.

Usage: python benchmarks/bench_process_merge.py [--n N]

1. One process, n = 1e6 rows: seconds (best of 3) of ``from_batch`` for a
   SweepState at T = 50 and 1000 thresholds, a CalibrationState (B = 15 bins)
   and a RiskCoverageState (8 mantissa bits), and of one ``merge`` of each.
2. The bytes of each state (every leaf's ``nbytes``): what a merge exchanges.
3. The capacity: a state merged with itself until ``merge`` refuses (2^k rows in one
   bucket or bin): the largest row count merged, and whether every step kept the metric.
4. A ``jax.distributed`` job of 2 processes on 127.0.0.1 (gloo): each builds the
   states of its half, ``process_merge`` time (first call, compilation included,
   and the best of 10 warm calls), loopback bytes per warm merge (both processes'
   traffic, /proc/net/dev: heartbeats and anything else on lo included) and the
   collectives in the compiled merge.

Prints a table (stderr) and JSON (stdout). The machine is shared: times are
best-of and the load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import best_time, emit, load_average  # noqa: E402

from cwsa_jax.streaming import (CalibrationState, RiskCoverageState, SweepState,  # noqa: E402
                                process_merge)


def data(n: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  c = rng.uniform(0, 1, n).astype(np.float32)
  return c, rng.uniform(size=n) < c


def builders(num_thresholds: tuple[int, ...] = (50, 1000)) -> dict:
  out = {}
  for t in num_thresholds:
    thresholds = np.linspace(0.0, 0.99, t).astype(np.float32)
    out[f"sweep_T{t}"] = lambda c, k, th=thresholds: SweepState.from_batch(c, k, th)
  out["calibration_B15"] = lambda c, k: CalibrationState.from_batch(c, k, num_bins=15)
  out["risk_coverage_m8"] = lambda c, k: RiskCoverageState.from_batch(c, k)
  return out


def state_bytes(state) -> int:
  return int(sum(np.asarray(leaf).nbytes for leaf in jax.tree_util.tree_leaves(state)))


def one_process(n: int) -> dict:
  c, k = data(n)
  rows = {}
  for name, build in builders().items():
    state = build(c, k)
    seconds = best_time(build, c, k, repeats=3)
    merge_seconds = best_time(lambda s: s.merge(s), state, repeats=3)
    rows[name] = {"from_batch_seconds": seconds, "rows_per_second": n / seconds,
                  "merge_seconds": merge_seconds, "state_bytes": state_bytes(state)}
  return rows


def capacity() -> dict:
  """Rows in one bucket / bin a state holds before ``merge`` refuses, for each state.

  A state of 2^20 identical rows (c = 0.6 correct for the sweep: sum(1 - c) = 0.4 n;
  c = 0.95 correct for calibration; c = 0.95 wrong for risk-coverage, 4 mantissa bits)
  is merged with itself until ``merge`` raises ``ValueError`` (past its capacity);
  ``metric_kept`` says whether the metric stayed the same at every step.
  """
  n = 1 << 20
  c, k = np.full(n, 0.6, np.float32), np.ones(n, bool)
  high = np.full(n, 0.95, np.float32)
  cases = {
      "sweep": (SweepState.from_batch(c, k, [0.5]), lambda s: s.compute().cwsa[0]),
      "calibration": (CalibrationState.from_batch(high, k), lambda s: s.compute()),
      "risk_coverage": (RiskCoverageState.from_batch(high, ~k, mantissa_bits=4),
                        lambda s: s.compute().aurc),
  }
  out = {}
  for name, (state, metric) in cases.items():
    want = float(metric(state))
    out[name] = {"rows_merged": n, "rows_refused": None, "metric_kept": True}
    for doubling in range(1, 45):
      try:
        state = state.merge(state)
      except ValueError:
        out[name]["rows_refused"] = n << doubling
        break
      out[name]["rows_merged"] = n << doubling
      out[name]["metric_kept"] &= float(metric(state)) == want
  return out


# --------------------------------------------------------------------------- the 2-process job


def loopback_bytes() -> int:
  """Bytes sent over the loopback interface so far (each is also counted as received)."""
  with open("/proc/net/dev") as f:
    for line in f:
      if line.strip().startswith("lo:"):
        return int(line.split(":", 1)[1].split()[8])
  return -1


def worker(out: str, process_id: int, port: int, n: int) -> None:
  jax.config.update("jax_enable_recoverability", True)
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                             process_id=process_id, coordinator_bind_address=f"127.0.0.1:{port}",
                             initialization_timeout=60)
  from jax._src import distributed
  from jax.experimental import multihost_utils
  c, k = data(n)
  half = slice(0, n // 2) if process_id == 0 else slice(n // 2, n)
  report = {}
  for name, build in builders((50,)).items():
    state = build(c[half], k[half])
    start = time.perf_counter()
    jax.block_until_ready(process_merge(state))
    first = time.perf_counter() - start
    multihost_utils.sync_global_devices(f"{name} warm")
    before, times = loopback_bytes(), []
    for _ in range(10):
      start = time.perf_counter()
      jax.block_until_ready(process_merge(state))
      times.append(time.perf_counter() - start)
    moved = loopback_bytes() - before
    report[name] = {"first_seconds": first, "warm_seconds": min(times),
                    "loopback_bytes_per_merge": moved / 10, "state_bytes": state_bytes(state)}
  with open(os.path.join(out, f"worker{process_id}.json"), "w") as f:
    json.dump({"merges": report, "collectives_of_last": merge_collectives(state)}, f)
  multihost_utils.sync_global_devices("done")
  if process_id != 0:
    jax.distributed.shutdown()
  else:  # process 0 hosts the coordinator: it leaves last
    distributed.global_state.client.get_live_nodes([0, 1])


def merge_collectives(state) -> dict:
  """The collective ops (and their shapes) in the compiled HLO of process_merge's all-reduce."""
  from cwsa_jax._states import _merge
  count = jax.process_count()
  devices = tuple(jax.local_devices(process_index=p)[0] for p in range(count))
  mesh, reduce = _merge._process_reducer(devices)
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(_merge._PROCESS_AXIS))
  local = devices[jax.process_index()]
  stacked = jax.tree.map(lambda x: jax.make_array_from_single_device_arrays(
      (count,) + np.shape(x), rows, [jax.device_put(np.asarray(x)[None], local)]), state)
  found = []
  for line in reduce.lower(stacked).compile().as_text().splitlines():
    for op in ("all-reduce", "all-gather", "collective-permute", "reduce-scatter", "all-to-all"):
      for call in (f" {op}(", f" {op}-start("):
        if call in line:
          found.append(line.split("=", 1)[1].split(call, 1)[0].strip() + call.rstrip("("))
  return found


def two_processes(n: int) -> dict:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  with tempfile.TemporaryDirectory() as out:
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", out, str(i), str(port),
                               str(n)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for i in range(2)]
    try:
      logs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
      for p in procs:
        if p.poll() is None:
          p.kill()
    if any(p.returncode for p in procs):
      raise RuntimeError("the 2-process job failed:\n" + "\n---\n".join(l[-3000:] for l in logs))
    with open(os.path.join(out, "worker0.json")) as f:
      return json.load(f)


def main() -> None:
  if len(sys.argv) > 1 and sys.argv[1] == "--worker":
    worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    return
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--n", type=int, default=1_000_000)
  args = parser.parse_args()
  load_before = load_average()
  single = one_process(args.n)
  limit = capacity()
  merged = two_processes(args.n)
  table = [f"n = {args.n:.0e}, load average {load_before}",
           f"{'state':18s} {'from_batch s':>12s} {'rows/s':>10s} {'merge s':>9s} {'bytes':>9s}"]
  for name, r in single.items():
    table.append(f"{name:18s} {r['from_batch_seconds']:12.4f} {r['rows_per_second']:10.3g} "
                 f"{r['merge_seconds']:9.5f} {r['state_bytes']:9d}")
  for name, r in limit.items():
    table.append(f"capacity, {name}: merged up to {r['rows_merged']:.3g} rows in one bucket "
                 f"(metric kept: {r['metric_kept']}), refused at {r['rows_refused']:.3g}")
  table.append(f"{'process_merge (2)':18s} {'first s':>12s} {'warm s':>10s} {'lo bytes':>9s} "
               f"{'state bytes':>11s}")
  for name, r in merged["merges"].items():
    table.append(f"{name:18s} {r['first_seconds']:12.4f} {r['warm_seconds']:10.4f} "
                 f"{r['loopback_bytes_per_merge']:9.0f} {r['state_bytes']:11d}")
  table.append(f"collectives of the last merge: {merged['collectives_of_last']}")
  emit("process_merge", {"n": args.n, "load_average": load_before, "one_process": single,
                         "capacity": limit, "two_processes": merged}, table=table)


if __name__ == "__main__":
  main()
