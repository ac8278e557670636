"""Ctrl-C and kill safety of the command line.

- SIGINT: every command stops within 5 s, exits 130 and leaves no output.
- SIGKILL at seeded random moments of ``evaluate`` and ``demo`` never leaves a
  partial result in place of the previous complete one, and the next run
  leaves no temporary.
- A KeyboardInterrupt that Python drops (raised in a weakref callback, as
  matplotlib's figures trigger) still aborts the run; a command that swallows
  Ctrl-C is ended by the watchdog.

The subprocesses share a persistent JAX compilation cache, so only the first
run of each command compiles. Each test runs with Python's default Ctrl-C
handler in place: a test run started in the background of a shell inherits
SIGINT ignored, which the commands (rightly) respect.
"""

import gzip
import json
import os
import pathlib
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import pytest

from cwsa_jax import cli
from cwsa_jax.cli import _interrupt

# Every case starts whole commands and interrupts or kills them: left to CI.
pytestmark = pytest.mark.slow

ROOT = str(pathlib.Path(__file__).resolve().parents[1])
MANIFEST = ".cwsa-jax-output.json"
N = 300


@pytest.fixture(autouse=True)
def python_sigint():
  """Python's own Ctrl-C handler here, so the subprocesses start with SIGINT at its default
  (exec resets a handler, not an ignore)."""
  old = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, old)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  cache = tmp_path_factory.mktemp("jax-cache")
  return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, CWSA_JAX_PROGRESS="1",
              JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
              JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
              CWSA_JAX_CACHE=str(tmp_path_factory.mktemp("data-cache")))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
  """A predictions CSV and .npz (n = 300) and a tiny learnable MNIST in IDX files."""
  root = tmp_path_factory.mktemp("inputs")
  rng = np.random.default_rng(7)
  c = rng.uniform(0.3, 1.0, N)
  ok = rng.uniform(size=N) < c
  (root / "preds.csv").write_text(
      "confidence,correct\n" + "".join(f"{float(x)!r},{int(k)}\n" for x, k in zip(c, ok)))
  np.savez(root / "a.npz", confidences=c.astype(np.float32), correct=ok)
  np.savez(root / "b.npz", confidences=np.clip(c + 0.05, 0, 1).astype(np.float32), correct=ok)
  mnist = root / "mnist"
  mnist.mkdir()
  for split, n in (("train", 192), ("t10k", 64)):
    labels = rng.integers(0, 10, n)
    images = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
    for i, y in enumerate(labels):
      images[i, 2 + 2 * y:4 + 2 * y, 4:24] = 255
    for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
      header = struct.pack(">I", {1: 0x801, 3: 0x803}[array.ndim])
      header += b"".join(struct.pack(">I", d) for d in array.shape)
      with gzip.open(mnist / f"{split}-{kind}-ubyte.gz", "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())
  return root


class Run:
  """``cwsa-jax ARGS`` in a subprocess, its stderr collected by a thread."""

  def __init__(self, args, cwd, env):
    self.proc = subprocess.Popen([sys.executable, "-m", "cwsa_jax.cli", *map(str, args)], cwd=cwd,
                                 env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    self.err = b""
    self.reader = threading.Thread(target=self._read, daemon=True)
    self.reader.start()

  def _read(self):
    for chunk in iter(lambda: os.read(self.proc.stderr.fileno(), 4096), b""):
      self.err += chunk

  def wait_for(self, marker, timeout=120.0):
    deadline = time.monotonic() + timeout
    while marker.encode() not in self.err:
      assert self.proc.poll() is None, f"ended before {marker!r}: {self.err[-2000:]!r}"
      assert time.monotonic() < deadline, f"no {marker!r} in {timeout} s: {self.err[-2000:]!r}"
      time.sleep(0.01)

  def wait(self, timeout=300.0):
    code = self.proc.wait(timeout=timeout)
    self.reader.join(timeout=5)
    return code

  def stderr_lines(self):
    return [line for line in self.err.decode(errors="replace").replace("\r", "\n").splitlines()
            if line.strip()]


def listing(folder):
  return sorted(p.name for p in pathlib.Path(folder).iterdir())


# --------------------------------------------------------------------------
# SIGINT: exit 130 within 5 s, nothing left behind
# --------------------------------------------------------------------------

# (command line, progress bar to wait for, seconds to wait after it). The long steps are made
# long on purpose (many resamples) so that the signal lands in the middle of them.
SIGINT_CASES = {
    "demo": (["demo", "--seeds", "3", "--n", "300", "--out", "OUT"], "figures", 0.3),
    "evaluate": (["evaluate", "IN/preds.csv", "--out", "OUT", "--bootstrap", "100000"],
                 "bootstrap", 0.3),
    "compare": (["compare", "IN/a.npz", "IN/b.npz", "--bootstrap", "100000", "--out", "OUT"],
                "bootstrap", 0.3),
    "reproduce-paper": (["reproduce-paper", "--seeds", "4", "--n", "500", "--out", "OUT"],
                        "figures", 0.2),
    "train": (["train", "--dataset", "mnist", "--data-dir", "IN/mnist", "--out", "OUT",
               "--epochs", "2", "--batch-size", "32"], "mnist/ce", 0.2),
}


@pytest.mark.parametrize("command", list(SIGINT_CASES))
def test_sigint_stops_every_command_with_130_and_no_output(command, tmp_path, env, inputs):
  argv, marker, delay = SIGINT_CASES[command]
  out = tmp_path / ("out.json" if command == "compare" else "out")
  argv = [str(out) if a == "OUT" else a.replace("IN", str(inputs)) for a in argv]
  before = listing(tmp_path)
  run = Run(argv, tmp_path, env)
  run.wait_for(marker)
  time.sleep(delay)
  sent = time.monotonic()
  run.proc.send_signal(signal.SIGINT)
  code = run.wait(timeout=60)
  elapsed = time.monotonic() - sent
  assert code == 130, run.err[-2000:]
  assert elapsed < 5.0, elapsed
  lines = run.stderr_lines()
  assert lines[-1] == f"cwsa-jax {command}: interrupted", lines[-3:]
  assert "Traceback" not in run.err.decode(errors="replace")
  if command == "train" and out.exists():
    # A Ctrl-C after the first epoch keeps its checkpoint for --resume, and nothing else.
    assert listing(out) == ["checkpoint.json", "checkpoint.msgpack", "config.json"]
    assert any("continue with --resume" in line for line in lines)
  else:
    assert listing(tmp_path) == before  # no output, no temporary


# --------------------------------------------------------------------------
# SIGKILL at random moments
# --------------------------------------------------------------------------


def check_complete(folder, command):
  """The folder is one whole result: its manifest lists exactly its files and each parses."""
  manifest = json.loads((folder / MANIFEST).read_text())
  assert manifest["command"] == command
  assert manifest["files"] == sorted(p.name for p in folder.iterdir() if p.name != MANIFEST)
  for name in manifest["files"]:
    data = (folder / name).read_bytes()
    if name.endswith(".json"):
      assert json.loads(data)["command"] == command
    elif name.endswith(".png"):
      assert data.startswith(b"\x89PNG\r\n\x1a\n") and data[-12:-4] == b"\x00\x00\x00\x00IEND"
    else:
      assert name.endswith(".md") and data.startswith(b"# ")


def temporaries(folder):
  return [n for n in listing(folder) if ".cwsa-tmp-" in n or ".cwsa-old-" in n]


def first_seen(folder, run, prefix):
  """Seconds until a temporary named ``prefix...`` appears in ``folder`` (None if never)."""
  start = time.monotonic()
  while run.proc.poll() is None:
    if any(n.startswith(prefix) for n in os.listdir(folder)):
      return time.monotonic() - start
    time.sleep(0.002)
  return None


KILL_CASES = {
    "evaluate": (["evaluate", "IN/preds.csv", "--out", "OUT", "--bootstrap", "0"], 4),
    "demo": (["demo", "--seeds", "3", "--n", "300", "--out", "OUT"], 4),
}


@pytest.mark.parametrize("command", list(KILL_CASES))
def test_sigkill_at_random_moments_never_leaves_a_partial_result(command, tmp_path, env, inputs):
  base, kills = KILL_CASES[command]
  out = tmp_path / "res"
  argv = [str(out) if a == "OUT" else a.replace("IN", str(inputs)) for a in base]
  quiet = dict(env, CWSA_JAX_PROGRESS="0")
  # The first, complete result, and when it began writing: the kills are drawn from its timing
  # (it may include compilation, which the persistent cache saves the later runs).
  start = time.monotonic()
  first = Run(argv, tmp_path, quiet)
  writing_starts = first_seen(tmp_path, first, ".res.cwsa-tmp-")
  assert first.wait() == 0, first.err[-2000:]
  duration = time.monotonic() - start
  check_complete(out, command)
  assert writing_starts is not None
  writing = duration - writing_starts
  rng = np.random.default_rng(20240 + len(command))
  killed_while_writing = 0
  for k in range(kills):
    run = Run(argv + ["--force"], tmp_path, quiet)
    if k % 2:  # half of the kills while the output is being written
      seen = first_seen(tmp_path, run, ".res.cwsa-tmp-")
      if seen is not None:
        time.sleep(rng.uniform(0.0, 1.2) * writing)
    else:  # half uniformly over the whole run
      time.sleep(rng.uniform(0.0, 1.1) * duration)
    run.proc.kill()
    run.wait()
    check_complete(out, command)  # the previous result, or the new one: never a partial one
    killed_while_writing += bool(temporaries(tmp_path))  # the next run must remove it
  last = Run(argv + ["--force"], tmp_path, quiet)
  assert last.wait() == 0, last.err[-2000:]
  check_complete(out, command)
  assert temporaries(tmp_path) == []
  assert killed_while_writing >= 1  # the test did hit the moments that matter


# --------------------------------------------------------------------------
# A dropped KeyboardInterrupt, and the watchdog
# --------------------------------------------------------------------------


def _drop_a_keyboard_interrupt():
  """SIGINT delivered while a weakref callback runs: Python prints the KeyboardInterrupt
  ("Exception ignored in ...") and goes on, as happened during the demo's figures."""
  class Thing:
    pass

  def callback(_):
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(100_000):  # the handler runs in here; its exception is dropped
      pass

  thing = Thing()
  ref = weakref.ref(thing, callback)
  del thing
  return ref


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_dropped_keyboard_interrupt_still_aborts_the_run(tmp_path, capsys, monkeypatch, inputs):
  from cwsa_jax.cli import _evaluate
  monkeypatch.setattr(_interrupt, "GRACE_SECONDS", 600.0)  # the watchdog must not end pytest
  real = _evaluate.write_json_atomic
  dropped = []

  def write_after_a_dropped_interrupt(path, payload):
    dropped.append(_drop_a_keyboard_interrupt())
    return real(path, payload)

  monkeypatch.setattr(_evaluate, "write_json_atomic", write_after_a_dropped_interrupt)
  out = tmp_path / "res"
  code = cli.main(["evaluate", str(inputs / "preds.csv"), "--out", str(out), "--no-figures",
                   "--bootstrap", "0"])
  err = capsys.readouterr().err
  assert dropped, "the hook did not run"
  assert code == 130, err
  assert err.strip().splitlines()[-1] == "cwsa-jax evaluate: interrupted"
  assert listing(tmp_path) == []  # nothing written, no temporary
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


WATCHDOG_SCRIPT = """
import os, pathlib, shutil, sys, time
from cwsa_jax.cli import _interrupt
tmp = pathlib.Path(sys.argv[1])
with _interrupt.guard("cwsa-jax test", grace=0.5):
  tmp.mkdir()
  _interrupt.register(lambda: shutil.rmtree(tmp))
  while True:  # code that swallows Ctrl-C (a broad except) and never ends by itself
    try:
      print("ready", flush=True)
      while True:
        time.sleep(0.05)
    except KeyboardInterrupt:
      pass
"""


def test_the_watchdog_ends_a_command_that_swallows_ctrl_c(tmp_path, env):
  proc = subprocess.Popen([sys.executable, "-c", WATCHDOG_SCRIPT, str(tmp_path / "partial")],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == "ready"
  assert (tmp_path / "partial").is_dir()
  sent = time.monotonic()
  proc.send_signal(signal.SIGINT)
  code = proc.wait(timeout=30)
  assert code == 130 and time.monotonic() - sent < 3.0, (code, proc.stderr.read())
  assert proc.stderr.read().strip().splitlines() == ["cwsa-jax test: interrupted"]
  assert listing(tmp_path) == []  # the registered temporary was removed
