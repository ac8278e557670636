"""Packaging: `python -m build` makes an sdist and a wheel; the wheel's core install works.

The wheel is installed (``--no-deps``) into a fresh venv that sees only jax, numpy and their
own requirements, linked from this environment (no download, no flax / optax /
tensorflow-datasets / matplotlib / tqdm). In it: ``import cwsa_jax`` runs ``sweep``, ``ece``,
``aurc`` and the streaming states, ``cwsa-jax compare`` and ``evaluate --no-figures`` run, and a
command that needs an extra names it in one line (exit 2). The build itself runs isolated, as pip does (it fetches setuptools from the index).
"""

import email.parser
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import cwsa_jax as cw

# One xdist worker builds the sdist and wheel once for all these tests (dev.sh runs each file on
# one worker; the mark does the same under --dist loadgroup).
# Builds wheels and installs them into fresh environments: left to CI.
pytestmark = [pytest.mark.xdist_group("packaging"), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = ("flax", "optax", "tensorflow_datasets", "matplotlib", "PIL", "tqdm", "clu")
_SKIP = {".git", ".hypothesis", ".pytest_cache", "__pycache__", "build", "dist", "results", "runs",
         "out", ".cache", "_build", ".ipynb_checkpoints"}


def _ignore(directory, names):
  return [n for n in names if n in _SKIP or n.endswith(".egg-info")
          or (Path(directory, n) / "pyvenv.cfg").exists()]


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
  """``python -m build`` of a copy of the checkout: the sdist, then the wheel built from it."""
  tmp = tmp_path_factory.mktemp("packaging")
  src = tmp / "src"
  shutil.copytree(ROOT, src, ignore=_ignore)
  out = tmp / "dist"
  proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(src)],
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  (wheel,), (sdist,) = out.glob("*.whl"), out.glob("*.tar.gz")
  return wheel, sdist


def test_wheel_installs_cwsa_jax_only(dist):
  wheel, _ = dist
  names = zipfile.ZipFile(wheel).namelist()
  tops = {n.split("/")[0] for n in names}
  assert tops == {"cwsa_jax", f"cwsa_jax-{cw.__version__}.dist-info"}, tops
  assert "cwsa_jax/training/train.py" in names and "cwsa_jax/training/_cmd_train.py" in names
  assert "cwsa_jax/nnx.py" in names


def test_sdist_holds_the_training_folder(dist):
  _, sdist = dist
  names = {n.split("/", 1)[-1] for n in tarfile.open(sdist).getnames()}
  assert {"pyproject.toml", "README.md", "cwsa_jax/cli/__init__.py", "training/train.py"} <= names


def _metadata(wheel):
  with zipfile.ZipFile(wheel) as z:
    text = z.read(f"cwsa_jax-{cw.__version__}.dist-info/METADATA").decode()
  return email.parser.Parser().parsestr(text)


def test_core_requirements_are_jax_and_numpy(dist):
  meta = _metadata(dist[0])
  requirements = [Requirement(r) for r in meta.get_all("Requires-Dist")]
  core = {r.name for r in requirements if r.marker is None}
  assert core == {"jax", "numpy"}

  def extra(name):
    return {canonicalize_name(r.name) for r in requirements
            if r.marker is not None and r.marker.evaluate({"extra": name})}

  assert set(meta.get_all("Provides-Extra")) >= {"plots", "train", "all", "dev"}
  assert extra("plots") == {"matplotlib"}
  assert extra("train") >= {"flax", "optax", "tensorflow-datasets", "pillow"}
  assert "cwsa-jax" in extra("dev") and "build" in extra("dev")


def _closure(names):
  """The installed distributions ``names`` need, with their requirements (no extras), recursively."""
  seen, todo = {}, list(names)
  while todo:
    name = canonicalize_name(todo.pop())
    if name in seen:
      continue
    seen[name] = dist = importlib.metadata.distribution(name)
    for r in map(Requirement, dist.requires or []):
      if r.marker is None or r.marker.evaluate({"extra": ""}):
        todo.append(r.name)
  return seen


def _link_core_dependencies(venv: Path, target: Path) -> set[str]:
  """Links jax, numpy and what they require into ``target``, put on the venv's path by a .pth."""
  target.mkdir()
  dists = _closure(["jax", "numpy"])
  for dist in dists.values():
    root = Path(dist.locate_file(""))
    for top in {Path(str(f)).parts[0] for f in dist.files or []} - {".."}:  # packages, dist-info
      if (root / top).exists() and not (target / top).exists():
        (target / top).symlink_to(root / top)
  assert (target / "jax").exists() and (target / "numpy").exists()
  purelib = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True).stdout.strip()
  Path(purelib, "_core_dependencies.pth").write_text(str(target) + "\n")
  return set(dists)


_CORE_SCRIPT = r"""
import importlib.util, json, sys
optional = {optional!r}
found = [m for m in optional if importlib.util.find_spec(m) is not None]
import numpy as np
import cwsa_jax as cw
from cwsa_jax import streaming
rng = np.random.default_rng(0)
c = rng.uniform(size=500).astype(np.float32)
k = rng.uniform(size=500) < c
t = np.linspace(0.5, 0.95, 10).astype(np.float32)
r = cw.sweep(c, k, t)
state = streaming.SweepState.from_batch(c[:200], k[:200], t).merge(
    streaming.SweepState.from_batch(c[200:], k[200:], t))
result = streaming.evaluate_batches([(c[:250], k[:250]), (c[250:], k[250:])], t, progress=True)
print(json.dumps({{
    "found": found, "file": cw.__file__, "loaded": sorted(set(optional) & set(sys.modules)),
    "cwsa": np.asarray(r.cwsa).tolist(), "state_cwsa": np.asarray(state.compute().cwsa).tolist(),
    "ece": float(cw.ece(c, k)), "aurc": float(cw.aurc(c, k)),
    "evaluate_batches_aurc": float(result.risk_coverage.aurc)}}))
"""


def test_core_install_runs_without_the_extras(dist, tmp_path):
  wheel, _ = dist
  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
  linked = _link_core_dependencies(venv, tmp_path / "core-deps")
  assert not linked & {"flax", "optax", "tensorflow-datasets", "matplotlib", "tqdm"}, linked
  python = venv / "bin" / "python"
  pip = [sys.executable, "-m", "pip", "--python", str(python)]
  proc = subprocess.run(pip + ["install", "--no-deps", "--no-index", "--quiet", str(wheel)],
                        capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr
  check = subprocess.run(pip + ["check"], capture_output=True, text=True)  # jax, numpy satisfied
  assert check.returncode == 0, check.stdout + check.stderr

  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
  env["JAX_PLATFORMS"] = "cpu"
  run = lambda *args: subprocess.run(list(args), capture_output=True, text=True, cwd=tmp_path,
                                     env=env, timeout=300)
  proc = run(str(python), "-c", _CORE_SCRIPT.format(optional=OPTIONAL))
  assert proc.returncode == 0, proc.stderr[-3000:]
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  assert got["found"] == [] and got["loaded"] == []
  assert Path(got["file"]).resolve().is_relative_to(venv.resolve())  # the wheel, not the checkout
  rng = np.random.default_rng(0)
  c = rng.uniform(size=500).astype(np.float32)
  k = rng.uniform(size=500) < c
  t = np.linspace(0.5, 0.95, 10).astype(np.float32)
  expected = np.asarray(cw.sweep(c, k, t).cwsa).tolist()
  assert got["cwsa"] == expected and got["state_cwsa"] == expected
  assert got["ece"] == float(cw.ece(c, k)) and got["aurc"] == float(cw.aurc(c, k))
  assert abs(got["evaluate_batches_aurc"] - got["aurc"]) < 1e-3

  # A command that needs an extra says which, in one line, exit status 2, nothing written.
  cli = str(venv / "bin" / "cwsa-jax")
  for args, extra in ((["demo", "--out", str(tmp_path / "demo")], "plots"),
                      (["train", "--dataset", "mnist", "--out", str(tmp_path / "run")], "train")):
    proc = run(cli, *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pip install 'cwsa-jax[{extra}]'" in lines[0], proc.stderr
    assert proc.stdout == ""
  assert not (tmp_path / "demo").exists() and not (tmp_path / "run").exists()
  # The commands without figures need only the core install.
  for name, shift in (("a", 0.0), ("b", 0.05)):
    rows = [f"{min(1.0, x + shift)!r},{int(right)}" for x, right in zip(c[:60].tolist(), k[:60])]
    (tmp_path / f"{name}.csv").write_text("confidence,correct\n" + "\n".join(rows) + "\n")
  proc = run(cli, "evaluate", "a.csv", "--out", "eval", "--no-figures", "--bootstrap", "200")
  assert proc.returncode == 0, proc.stderr[-3000:]
  written = json.loads((tmp_path / "eval" / "metrics.json").read_text())
  assert written["n"] == 60 and "intervals" in written and (tmp_path / "eval" / "report.md").exists()
  assert not list((tmp_path / "eval").glob("*.png"))
  proc = run(cli, "compare", "a.csv", "b.csv", "--bootstrap", "200", "--out", "compare.json")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert json.loads((tmp_path / "compare.json").read_text())["n"] == 60
  proc = run(cli, "evaluate", "a.csv", "--out", "figures")  # figures need the plots extra
  assert proc.returncode == 2 and "pip install 'cwsa-jax[plots]'" in proc.stderr
  assert not (tmp_path / "figures").exists()

  proc = run(str(python), "-c", "import cwsa_jax.nnx")
  assert proc.returncode == 1 and "cwsa_jax.nnx needs flax: pip install 'cwsa-jax[train]'" in proc.stderr
  proc = run(cli, "--help")
  assert proc.returncode == 0 and "cwsa-jax[plots]" in proc.stdout and "train" in proc.stdout
