"""process_merge across the processes of a jax.distributed job: two processes on 127.0.0.1.

The job tests start two processes of this file (``python tests/test_process_merge.py OUT_DIR
PROCESS_ID PORT SCENARIO``): a ``jax.distributed`` job whose coordinator binds to loopback only,
with JAX's CPU collectives (gloo over TCP). Each process evaluates its half of one seeded data set
and merges the states with ``process_merge``; the parent computes the same metrics in one process
on all the data and compares bit for bit. The children are killed with SIGKILL after ``TIMEOUT``
(JAX's preemption notifier catches SIGTERM), so a hung merge fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

# Starts several processes that merge over jax.distributed: left to CI.
pytestmark = pytest.mark.slow

N = 3001  # odd: the two halves differ in size (a state's size does not depend on n)
THRESHOLDS = np.array([0.0, 0.25, 0.5, 0.7, 0.9, 0.99, 0.3], np.float32)
NUM_BINS = 15
MANTISSA_BITS = 6
TIMEOUT = 120  # seconds for a whole two-process run (two merges of every state, on a loaded CI host)
DOUBLINGS = 33  # each process's states doubled this often: 1.3e13 samples in all, past int32 sums
HEARTBEAT = {"merge": 30, "die": 4}  # seconds without heartbeats before a process counts as dead
SWEEP_FIELDS = ("coverage", "selective_accuracy", "cwsa", "cwsa_plus")
RC_FIELDS = ("aurc", "aurc_low", "aurc_high", "augrc", "augrc_low", "augrc_high", "exact")


def dataset():
  """The whole data set: uniform confidences with ties, the ends of [0, 1] and threshold values."""
  rng = np.random.default_rng(20261126)
  c = rng.uniform(0, 1, N).astype(np.float32)
  c[:120] = np.repeat(np.array([0.0, 1.0, 0.5, 0.25, 0.9, 0.99], np.float32), 20)
  rng.shuffle(c)
  return c, rng.uniform(size=N) < c


def states(c, k):
  from cwsa_jax.streaming import CalibrationState, RiskCoverageState, SweepState
  return (SweepState.from_batch(c, k, THRESHOLDS),
          CalibrationState.from_batch(c, k, num_bins=NUM_BINS),
          RiskCoverageState.from_batch(c, k, mantissa_bits=MANTISSA_BITS))


def results(sweep_state, cal_state, rc_state) -> dict:
  """The merged sums and every metric computed from them, as NumPy arrays."""
  out = {}
  for name, s in (("sweep", sweep_state), ("cal", cal_state), ("rc", rc_state)):
    for leaf in ("hi", "lo", "top", "invalid", "key_min", "key_max"):
      if hasattr(s, leaf):
        out[f"{name}_{leaf}"] = np.asarray(getattr(s, leaf))
  sweep = sweep_state.compute()
  out.update({f"sweep_{f}": np.asarray(getattr(sweep, f)) for f in SWEEP_FIELDS})
  out["ece"] = np.asarray(cal_state.compute())
  bins = cal_state.bins()
  out.update(bin_confidence=np.asarray(bins.mean_confidence),
             bin_accuracy=np.asarray(bins.accuracy))
  rc = rc_state.compute()
  out.update({f"rc_{f}": np.asarray(getattr(rc, f)) for f in RC_FIELDS})
  return out


# --------------------------------------------------------------------------- one process of the job


def worker(out_dir: str, process_id: int, port: int, scenario: str) -> None:
  import jax
  jax.config.update("jax_platforms", "cpu")
  # A process that dies makes the others raise in process_merge instead of being aborted by JAX.
  jax.config.update("jax_enable_recoverability", True)
  jax.distributed.initialize(
      coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
      coordinator_bind_address=f"127.0.0.1:{port}", initialization_timeout=30,
      heartbeat_timeout_seconds=HEARTBEAT[scenario], shutdown_timeout_seconds=10)
  from cwsa_jax.streaming import SweepState, process_merge

  c, k = dataset()
  half = slice(0, N // 2) if jax.process_index() == 0 else slice(N // 2, N)
  # Building a state also initializes the CPU backend, itself a rendezvous of all the processes.
  mine = states(c[half], k[half]) if scenario == "merge" else [SweepState.from_batch(
      c[half], k[half], THRESHOLDS)]
  report = {"process_id": jax.process_index(), "process_count": jax.process_count()}
  if scenario == "die" and process_id == 1:
    os._exit(3)  # a crash: no cleanup, no goodbye to the coordinator
  start = time.perf_counter()
  try:
    merged = [process_merge(s) for s in mine]
  except RuntimeError as err:
    report.update(error=str(err), seconds=time.perf_counter() - start)
  else:
    report["seconds"] = time.perf_counter() - start
    np.savez(os.path.join(out_dir, f"merged{process_id}.npz"), **results(*merged))
    # Large counts: each process's states doubled DOUBLINGS times, then merged the same way.
    double = jax.jit(lambda s: s.merge(s))
    for _ in range(DOUBLINGS):
      mine = [double(s) for s in mine]
    large = [process_merge(s) for s in mine]
    np.savez(os.path.join(out_dir, f"large{process_id}.npz"), **results(*large))
    # Mismatched configurations: every process raises, naming the odd one, and nothing hangs.
    other = THRESHOLDS if process_id == 0 else THRESHOLDS[:-1]
    for name, value in (("thresholds", SweepState.empty(other)),
                        ("type", mine[0] if process_id == 0 else {"not": "a state"})):
      try:
        process_merge(value)
        report[f"{name}_error"] = None
      except (TypeError, ValueError) as err:
        report[f"{name}_error"] = f"{type(err).__name__}: {err}"
  with open(os.path.join(out_dir, f"report{process_id}.json"), "w") as f:
    json.dump(report, f)
  if "error" not in report:
    leave_in_order(process_id)


def leave_in_order(process_id: int) -> None:
  """Exits with process 0 last: with recoverability on, JAX no longer synchronizes the exit.

  Process 0 hosts the coordinator; a process still connected when it goes aborts
  in ``jax.distributed.shutdown``. ``get_live_nodes`` waits for every live
  process to call it or to disconnect.
  """
  import jax
  from jax._src import distributed
  from jax.experimental import multihost_utils
  multihost_utils.sync_global_devices("test_process_merge: done")
  if process_id != 0:
    jax.distributed.shutdown()
  else:
    distributed.global_state.client.get_live_nodes([0, 1])


# --------------------------------------------------------------------------- the tests


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run_job(tmp_path, scenario, meanwhile=lambda: None):
  """Runs the two processes (and ``meanwhile()`` here); returns exit codes, reports, logs, time."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  port = free_port()
  start = time.perf_counter()
  log_paths = [tmp_path / f"log{i}.txt" for i in range(2)]
  procs = []
  try:
    for i, log_path in enumerate(log_paths):
      with open(log_path, "w") as log:
        procs.append(subprocess.Popen(
            [sys.executable, __file__, str(tmp_path), str(i), str(port), scenario],
            env=env, stdout=log, stderr=subprocess.STDOUT))
    meanwhile()
    for proc in procs:
      proc.wait(timeout=max(1.0, TIMEOUT - (time.perf_counter() - start)))
  except subprocess.TimeoutExpired:
    tails = [path.read_text()[-2000:] for path in log_paths]
    raise AssertionError(f"the {scenario} job did not finish in {TIMEOUT} s:\n"
                         + "\n---\n".join(tails)) from None
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()  # SIGKILL: JAX's preemption notifier catches SIGTERM
        proc.wait()
  seconds = time.perf_counter() - start
  logs = [path.read_text() for path in log_paths]
  reports = []
  for i in range(2):
    path = tmp_path / f"report{i}.json"
    reports.append(json.loads(path.read_text()) if path.exists() else None)
  return [p.returncode for p in procs], reports, logs, seconds


def test_process_merge_of_two_halves_equals_one_process_bit_for_bit(tmp_path):
  one = {}
  c, k = dataset()
  codes, reports, logs, _ = run_job(tmp_path, "merge", lambda: one.update(results(*states(c, k))))
  assert codes == [0, 0], "\n---\n".join(log[-3000:] for log in logs)
  assert [r["process_count"] for r in reports] == [2, 2]
  for i in range(2):  # every process holds the global state
    with np.load(tmp_path / f"merged{i}.npz") as merged:
      assert sorted(merged.files) == sorted(one)
      for name, want in one.items():
        np.testing.assert_array_equal(merged[name], want, err_msg=f"process {i}: {name}")
  assert not one["rc_exact"]  # continuous confidences: a binned estimate with bounds

  # Each half doubled 2^33 times, then merged: the same metrics, and sums 2^33 times one's.
  for i in range(2):
    with np.load(tmp_path / f"large{i}.npz") as large:
      for name, want in one.items():
        kind, _, leaf = name.partition("_")
        if leaf in ("hi", "lo", "top"):
          continue
        if leaf == "aurc_high":  # min(1, E / (K + 1)) per bin: a bound that moves with K
          assert large["rc_aurc"] <= large[name], (i, name)
        elif kind == "rc" and leaf != "exact":
          np.testing.assert_allclose(large[name], want, rtol=1e-6, err_msg=f"process {i}: {name}")
        else:
          np.testing.assert_array_equal(large[name], want, err_msg=f"process {i}: {name}")
      for kind in ("sweep", "cal", "rc"):
        value = lambda d: (d[f"{kind}_top"].astype(object) * (1 << 36)  # noqa: E731
                           + d[f"{kind}_hi"].astype(object) * (1 << 12) + d[f"{kind}_lo"])
        assert np.all(value(large) == value(one) * (1 << DOUBLINGS)), (i, kind)

  for r in reports:  # a mismatch raises on every process, naming process 1
    assert r["thresholds_error"].startswith("ValueError: process_merge: process 1 passed "
                                            "SweepState(6 thresholds"), r
    assert "process 0 passed SweepState(7 thresholds" in r["thresholds_error"], r
    assert r["type_error"].startswith("TypeError: process_merge: process 1 passed a dict, not a "
                                      "SweepState"), r


def test_one_process_all_reduce_path_and_signatures():
  """In this process: stacking and reducing keeps every state; signatures tell configs apart."""
  import jax
  from cwsa_jax._states import _merge
  from cwsa_jax.streaming import CalibrationState, RiskCoverageState, SweepState, process_merge
  c, k = dataset()
  c2, k2 = c[:3000].reshape(2, 1500), k[:3000].reshape(2, 1500)  # a leading batch axis
  cases = [SweepState.from_batch(c2, k2, THRESHOLDS),
           SweepState.configure(thresholds=THRESHOLDS, graded=True).empty(),
           *states(c, k)]
  for state in cases:
    assert process_merge(state) is state
    merged = _merge._all_reduce_over_processes(state, 1)
    assert type(merged) is type(state)
    for a, b in zip(jax.tree_util.tree_leaves(merged), jax.tree_util.tree_leaves(state)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  signature = lambda s: _merge._merge_signature(s)[:2]
  variants = cases + [SweepState.empty(THRESHOLDS[:-1]), SweepState.empty(THRESHOLDS + 1e-3),
                      SweepState.configure(thresholds=THRESHOLDS, normalize="all").empty(),
                      CalibrationState.empty(7), CalibrationState.configure(norm="max").empty(),
                      RiskCoverageState.empty(mantissa_bits=4)]
  assert len({signature(s) for s in variants}) == len(variants)
  assert signature(SweepState.empty(THRESHOLDS)) == signature(cases[2])  # the same config
  assert _merge._merge_signature([1, 2])[0] == _merge._NOT_A_STATE


def test_process_dying_before_the_merge_is_named_and_nothing_is_written(tmp_path):
  codes, reports, logs, seconds = run_job(tmp_path, "die")
  assert codes[1] == 3 and reports[1] is None, logs[1][-3000:]
  assert codes[0] == 0, logs[0][-3000:]
  error = reports[0]["error"]
  assert error == ("process_merge: process 1 of 2 died before the merge (exited, crashed or "
                   "stopped sending heartbeats); nothing was merged"), error
  assert reports[0]["seconds"] < 4 * HEARTBEAT["die"], reports[0]
  assert not (tmp_path / "merged0.npz").exists()
  assert seconds < TIMEOUT


if __name__ == "__main__":
  worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
