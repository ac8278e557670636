"""Where the commands write, what ``--force`` may replace, write failures and the umask.

Every refused case must exit 2 with one line on stderr and leave the folder
around the output exactly as it was (names, sizes, mtimes and contents); every
accepted case must leave a complete result whose manifest lists exactly its
files, and no temporary.
"""

import errno
import fcntl
import hashlib
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from cwsa_jax import cli
from cwsa_jax.cli import _output

N = 300
MANIFEST = ".cwsa-jax-output.json"
ROOT = str(pathlib.Path(__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def data():
  rng = np.random.default_rng(5)
  c = rng.uniform(0.3, 1.0, N)
  ok = rng.uniform(size=N) < c
  return c, ok


def write_csv(path, data):
  c, ok = data
  rows = "".join(f"{float(x)!r},{int(k)}\n" for x, k in zip(c, ok))
  path.write_text("confidence,correct\n" + rows)
  return path


def snapshot(root, skip=()):
  """{relative path: (kind, size, mtime_ns, sha256)} of everything under ``root``, hidden too."""
  out = {}
  for dirpath, dirnames, filenames in os.walk(root):
    rel_dir = os.path.relpath(dirpath, root)
    if any(rel_dir == s or rel_dir.startswith(s + os.sep) for s in skip):
      continue
    for name in dirnames + filenames:
      path = os.path.join(dirpath, name)
      rel = os.path.relpath(path, root)
      if rel in skip:
        continue
      st = os.lstat(path)
      digest = None
      if os.path.isfile(path) and not os.path.islink(path):
        with open(path, "rb") as f:
          digest = hashlib.sha256(f.read()).hexdigest()
      out[rel] = ("dir" if os.path.isdir(path) else "file", st.st_size, st.st_mtime_ns, digest)
  return out


def refused(argv, capsys, *fragments):
  """Exit 2, one line on stderr holding ``fragments``, no traceback."""
  code = cli.main([str(a) for a in argv])
  err = capsys.readouterr().err
  lines = err.strip().splitlines()
  assert code == 2, err
  assert len(lines) == 1 and "Traceback" not in err, err
  for fragment in fragments:
    assert fragment in lines[0], lines[0]
  return lines[0]


def ran(argv, capsys):
  code = cli.main([str(a) for a in argv])
  captured = capsys.readouterr()
  assert code == 0, captured.err
  return captured.out


def check_result(folder, data, command="evaluate"):
  """A complete result: the manifest lists exactly the files present; metrics are right."""
  manifest = json.loads((folder / MANIFEST).read_text())
  assert manifest["tool"] == "cwsa-jax" and manifest["command"] == command
  present = sorted(p.name for p in folder.iterdir() if p.name != MANIFEST)
  assert manifest["files"] == present
  metrics = json.loads((folder / "metrics.json").read_text())
  c, ok = data
  assert metrics["n"] == N
  assert metrics["accuracy"] == pytest.approx(float(np.mean(ok)), abs=1e-6)  # float64 reference
  assert (folder / "report.md").read_text().startswith("#")


def evaluate_args(csv, out, *extra):
  return ["evaluate", csv, "--out", out, "--no-figures", "--bootstrap", "0", *extra]


def no_temporaries(folder):
  names = [p.name for p in pathlib.Path(folder).iterdir()]
  assert not [n for n in names if ".cwsa-tmp-" in n or ".cwsa-old-" in n or ".tmp-" in n], names


# --------------------------------------------------------------------------
# Refused paths: exit 2, one line, nothing around them changed
# --------------------------------------------------------------------------


def test_force_never_deletes_the_input_or_foreign_files(tmp_path, capsys, data):
  res = tmp_path / "res"
  res.mkdir()
  csv = write_csv(res / "preds.csv", data)
  (res / "notes.txt").write_text("my notes")
  before = snapshot(tmp_path)
  refused(evaluate_args(csv, res, "--force"), capsys, "holds the input", "preds.csv")
  assert snapshot(tmp_path) == before
  # The input elsewhere: notes.txt alone is still not the kit's to delete.
  other = write_csv(tmp_path / "preds.csv", data)
  (res / "preds.csv").unlink()
  before = snapshot(tmp_path)
  refused(evaluate_args(other, res, "--force"), capsys, "notes.txt", "no cwsa-jax manifest")
  assert snapshot(tmp_path) == before


def test_force_refuses_a_kit_folder_with_a_foreign_file_or_folder(tmp_path, capsys, data):
  csv = write_csv(tmp_path / "preds.csv", data)
  res = tmp_path / "res"
  ran(evaluate_args(csv, res), capsys)
  check_result(res, data)
  for foreign in ("notes.txt", "sub"):
    path = res / foreign
    path.write_text("mine") if foreign.endswith(".txt") else path.mkdir()
    before = snapshot(tmp_path)
    refused(evaluate_args(csv, res, "--force"), capsys, foreign, "did not write it")
    assert snapshot(tmp_path) == before
    path.unlink() if path.is_file() else path.rmdir()
  # A kit folder of its own: replaced, and nothing else around it changes.
  before = snapshot(tmp_path, skip=("res",))
  ran(evaluate_args(csv, res, "--force"), capsys)
  check_result(res, data)
  assert snapshot(tmp_path, skip=("res",)) == before


@pytest.mark.parametrize("case", ["dot", "empty", "file", "parent_is_file", "dotdot", "root",
                                  "home", "symlink"])
def test_special_and_impossible_out_paths(tmp_path, capsys, data, monkeypatch, case):
  # matplotlib's first import writes its font cache under $HOME (set to a new folder below):
  # import it first, as any earlier test in the same process has.
  import matplotlib.font_manager  # noqa: F401
  work = tmp_path / "work"
  work.mkdir()
  csv = write_csv(work / "preds.csv", data)
  (work / "existing.txt").write_text("a file")
  (work / "target").mkdir()
  os.symlink(work / "target", work / "link")
  home = tmp_path / "home"
  home.mkdir()
  monkeypatch.setenv("HOME", str(home))
  sub = work / "sub"
  sub.mkdir()
  monkeypatch.chdir(sub if case == "dotdot" else work)
  out, fragment = {
      "dot": (".", "is the current folder"),
      "empty": ("", "--out is empty"),
      "file": ("existing.txt", "exists and is not a folder"),
      "parent_is_file": ("existing.txt/res", "is not a folder"),
      "dotdot": ("..", "is a parent of the current folder"),
      "root": ("/", "is the root folder"),
      "home": (str(home), "is your home folder"),
      "symlink": ("link", "is a symbolic link"),
  }[case]
  before = snapshot(tmp_path)
  refused(["evaluate", csv, "--out", out, "--force", "--no-figures", "--bootstrap", "0"], capsys,
          fragment)
  assert snapshot(tmp_path) == before
  no_temporaries(work)


@pytest.mark.slow
def test_compare_out_paths(tmp_path, capsys, data):
  c, ok = data
  a, b = tmp_path / "a.npz", tmp_path / "b.npz"
  np.savez(a, confidences=c.astype(np.float32), correct=ok)
  np.savez(b, confidences=np.clip(c + 0.05, 0, 1).astype(np.float32), correct=ok)
  (tmp_path / "folder").mkdir()
  (tmp_path / "notes.json").write_text('{"mine": true}\n')
  (tmp_path / "plain").write_text("x")
  base = ["compare", a, b, "--bootstrap", "200"]
  before = snapshot(tmp_path)
  refused(base + ["--out", tmp_path / "folder"], capsys, "is a folder")
  refused(base + ["--out", a, "--force"], capsys, "is the input")
  refused(base + ["--out", tmp_path / "notes.json", "--force"], capsys, "not a cwsa-jax compare")
  refused(base + ["--out", tmp_path / "plain" / "c.json"], capsys, "is not a folder")
  refused(base + ["--out", ""], capsys, "--out is empty")
  assert snapshot(tmp_path) == before
  out = tmp_path / "cmp.json"
  ran(base + ["--out", out], capsys)
  first = json.loads(out.read_text())
  assert first["command"] == "compare" and first["n"] == N
  refused(base + ["--out", out], capsys, "already exists", "--force")
  ran(base + ["--out", out, "--force", "--seed", "1"], capsys)  # its own result: replaced
  assert json.loads(out.read_text())["seed"] == 1
  no_temporaries(tmp_path)


# --------------------------------------------------------------------------
# Atomic replacement, stale temporaries, the umask
# --------------------------------------------------------------------------


def test_stale_temporaries_are_cleaned_and_a_moved_result_is_put_back(tmp_path, capsys, data):
  csv = write_csv(tmp_path / "preds.csv", data)
  res = tmp_path / "res"
  ran(evaluate_args(csv, res), capsys)
  expected = snapshot(res)
  # A kill between the two renames of the fallback replacement: res moved aside, res missing.
  dead = 2 ** 22 + 12345  # above the default pid_max: no process has it
  moved = tmp_path / f".res.cwsa-old-{dead}-0badc0de"
  os.rename(res, moved)
  (tmp_path / f".res.cwsa-tmp-{dead}-deadbeef").mkdir()  # the half-written new result
  (tmp_path / f".res.cwsa-tmp-{dead}-deadbeef" / "metrics.json").write_text("{")
  (tmp_path / f".x.json.cwsa-tmp-{dead}-feedf00d").write_text("{")
  # A temporary whose writer is alive (it holds the lock) must survive.
  live = tmp_path / f".other.cwsa-tmp-{os.getpid()}-12345678"
  live.mkdir()
  fd = os.open(live, os.O_RDONLY)
  fcntl.flock(fd, fcntl.LOCK_EX)
  try:
    ran(evaluate_args(csv, tmp_path / "second"), capsys)  # any run beside them cleans up
  finally:
    os.close(fd)
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
      ["preds.csv", "res", "second", live.name])
  assert snapshot(res) == expected  # the previous complete result, back in place
  check_result(tmp_path / "second", data)


def test_replacement_without_rename_exchange(tmp_path, capsys, data, monkeypatch):
  csv = write_csv(tmp_path / "preds.csv", data)
  res = tmp_path / "res"
  ran(evaluate_args(csv, res), capsys)
  monkeypatch.setattr(_output, "_exchange", lambda a, b: False)  # e.g. not Linux
  ran(evaluate_args(csv, res, "--force", "--thresholds", "0.5,0.9"), capsys)
  check_result(res, data)
  assert json.loads((res / "metrics.json").read_text())["sweep"]["thresholds"] == [0.5,
                                                                                   pytest.approx(0.9)]
  no_temporaries(tmp_path)


def test_outputs_follow_the_umask(tmp_path, capsys, data):
  csv = write_csv(tmp_path / "preds.csv", data)
  c, ok = data
  np.savez(tmp_path / "a.npz", confidences=c.astype(np.float32), correct=ok)
  old = os.umask(0o027)
  try:
    ran(evaluate_args(csv, tmp_path / "res"), capsys)
    ran(["compare", tmp_path / "a.npz", tmp_path / "a.npz", "--bootstrap", "200", "--out",
         tmp_path / "cmp.json"], capsys)
  finally:
    os.umask(old)
  res = tmp_path / "res"
  assert res.stat().st_mode & 0o777 == 0o750
  for path in list(res.iterdir()) + [tmp_path / "cmp.json"]:
    assert path.stat().st_mode & 0o777 == 0o640, path


# --------------------------------------------------------------------------
# Write failures: one line, exit 2, the previous result intact, no temporaries
# --------------------------------------------------------------------------


def test_full_disk_while_writing_the_report(tmp_path, capsys, data, monkeypatch):
  csv = write_csv(tmp_path / "preds.csv", data)
  res = tmp_path / "res"
  ran(evaluate_args(csv, res), capsys)
  before = snapshot(tmp_path)
  real_write_text = pathlib.Path.write_text

  def full_disk(self, text, *args, **kwargs):
    if self.name == "report.md":
      real_write_text(self, text[:100], *args, **kwargs)  # part of it, then the disk is full
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
    return real_write_text(self, text, *args, **kwargs)

  monkeypatch.setattr(pathlib.Path, "write_text", full_disk)
  line = refused(evaluate_args(csv, res, "--force"), capsys, "cannot write", "report.md",
                 "No space left on device")
  assert ".cwsa-tmp-" not in line  # names the output, not the temporary
  monkeypatch.undo()
  assert snapshot(tmp_path) == before


# Applies the limits, then becomes the command line (no preexec_fn: JAX's threads and fork()
# do not mix).
_LAUNCHER = """
import ctypes, os, resource, sys
unprivileged, limit = sys.argv[1] == "1", int(sys.argv[2])
if unprivileged and os.geteuid() == 0:
  libc = ctypes.CDLL(None, use_errno=True)
  for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
    if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
      raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
if limit:
  resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
os.execv(sys.executable, [sys.executable, "-m", "cwsa_jax.cli", *sys.argv[3:]])
"""


def _run_cli(args, cwd, *, unprivileged=False, file_size_limit=0):
  """The command line in a subprocess; optionally without root's permission override (so that
  a read-only folder stays read-only for root) or with a file-size limit (writes fail)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  if file_size_limit:  # a compilation-cache write past the limit would warn on stderr
    env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
  return subprocess.run([sys.executable, "-c", _LAUNCHER, "1" if unprivileged else "0",
                         str(file_size_limit), *map(str, args)], cwd=cwd, capture_output=True,
                        text=True, env=env, timeout=300)


def test_read_only_destination(tmp_path, data):
  csv = write_csv(tmp_path / "preds.csv", data)
  ro = tmp_path / "ro"
  ro.mkdir()
  (ro / "keep.txt").write_text("x")
  ro.chmod(0o555)
  try:
    before = snapshot(tmp_path)
    for out in (ro / "res", ro / "a" / "b"):
      proc = _run_cli(evaluate_args(csv, out), tmp_path, unprivileged=True)
      assert proc.returncode == 2, proc.stderr
      lines = proc.stderr.strip().splitlines()
      assert len(lines) == 1 and "cannot write" in lines[0] and "not writable" in lines[0], lines
    assert snapshot(tmp_path) == before
  finally:
    ro.chmod(0o755)


def test_write_failure_from_the_kernel_keeps_the_previous_result(tmp_path, capsys, data):
  csv = write_csv(tmp_path / "preds.csv", data)
  res = tmp_path / "res"
  ran(evaluate_args(csv, res), capsys)
  before = snapshot(tmp_path)
  # metrics.json is ~10 KB: a 4 KB file-size limit makes its write() fail (EFBIG) half-way.
  proc = _run_cli(evaluate_args(csv, res, "--force"), tmp_path, file_size_limit=4096)
  assert proc.returncode == 2, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and "cannot write" in lines[0] and "File too large" in lines[0], lines
  assert snapshot(tmp_path) == before
