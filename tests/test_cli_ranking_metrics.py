"""``evaluate`` / ``compare``: AUROC, FPR@95TPR, average precision, smooth and classwise ECE in
metrics.json with their intervals, and ``evaluate --scores real``."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

import cwsa_jax as cw
from cwsa_jax import cli
from cwsa_jax._bootstrap import _sampler
from cwsa_jax.cli import _intervals, _metrics
from cwsa_jax.cli._settings import Settings

N, K = 120, 3
PEERS = ("auroc", "fpr_at_95tpr", "average_precision_success", "average_precision_error",
         "smooth_ece", "classwise_ece")
# 50 resamples at 80% keep 5 beyond each end (the CLI's minimum) and the runs short.
BOOT = ["--bootstrap", "50", "--level", "0.8"]


@pytest.fixture(scope="module")
def data():
  rng = np.random.default_rng(0)
  probs = rng.dirichlet(np.full(K, 0.6), size=N)
  labels = rng.integers(0, K, N)
  return probs, labels


def run(argv, capsys):
  code = cli.main([str(a) for a in argv])
  captured = capsys.readouterr()
  assert code == 0, captured.err
  return captured.out


def load(path):
  with open(path) as f:
    return json.load(f)


def test_evaluate_reports_peer_metrics_with_intervals(tmp_path, capsys, data):
  probs, labels = data
  np.savez(tmp_path / "p.npz", probs=probs, labels=labels)
  out = tmp_path / "out"
  stdout = run(["evaluate", tmp_path / "p.npz", "--out", out, "--no-figures", *BOOT], capsys)
  assert "AUROC" in stdout and "smooth ECE" in stdout and "classwise ECE" in stdout
  m = load(out / "metrics.json")
  c, ok = probs.max(1).astype(np.float32), probs.argmax(1) == labels
  assert m["auroc"] == pytest.approx(float(cw.auroc(c, ok)), abs=1e-6)
  assert m["auroc"] == pytest.approx(roc_auc_score(ok, c), abs=1e-6)
  assert m["fpr_at_95tpr"] == pytest.approx(float(cw.fpr_at_tpr(c, ok, 0.95)), abs=1e-6)
  assert m["average_precision_success"] == pytest.approx(average_precision_score(ok, c), abs=1e-6)
  assert m["average_precision_error"] == pytest.approx(average_precision_score(~ok, -c), abs=1e-6)
  assert m["smooth_ece"] == pytest.approx(float(cw.smooth_ece(c, ok)), abs=1e-6)
  assert m["classwise_ece"] == pytest.approx(
      float(cw.classwise_ece(probs.astype(np.float32), labels)), abs=1e-6)
  iv = m["intervals"]
  for name in PEERS:
    assert iv["low"][name] <= m[name] + 1e-6 and m[name] - 1e-6 <= iv["high"][name], name
    assert name in iv["estimate_outside_interval"]
  for name in ("accuracy", "ece", "aurc", "brier"):  # the existing keys stay
    assert name in m
  assert "cwsa" in m["sweep"] and "cwsa" in iv["low"]
  report = (out / "report.md").read_text()
  assert "AUROC" in report and "| auroc |" in report


def test_confidence_files_have_no_classwise_ece(tmp_path, capsys, data):
  probs, labels = data
  c, ok = probs.max(1), probs.argmax(1) == labels
  np.savez(tmp_path / "a.npz", confidences=c, correct=ok)
  np.savez(tmp_path / "b.npz", confidences=np.sqrt(c), correct=ok)
  run(["compare", tmp_path / "a.npz", tmp_path / "b.npz", "--out", tmp_path / "c.json", *BOOT],
      capsys)
  r = load(tmp_path / "c.json")
  assert "classwise_ece" not in r["difference"]
  # A monotone transform of the confidences keeps every rank metric: differences exactly 0.
  for name in PEERS[:4]:
    assert r["difference"][name] == 0 and r["p_value"][name] == 1, name
  assert r["estimate_a"]["auroc"] == pytest.approx(roc_auc_score(ok, c), abs=1e-6)
  assert r["difference"]["smooth_ece"] != 0


@pytest.mark.parametrize("scheme", [pytest.param("poisson", marks=pytest.mark.slow), "multinomial"])
def test_peer_resamples_are_the_library_on_the_resampled_rows(data, scheme):
  probs, labels = data
  probs = probs.astype(np.float32)
  c = np.round(probs.max(1), 2).astype(np.float32)  # ties
  ok = probs.argmax(1) == labels
  key = jax.random.key(7)
  model = _intervals.PeerInputs(c, ok, probs=probs, labels=labels)
  samples = _intervals._peer_samples(model, Settings(), scheme, key, 3)
  rows = jnp.arange(N, dtype=jnp.uint32)
  for b in range(3):
    seed = _sampler._seed(key, jnp.uint32(b))
    if scheme == "poisson":
      idx = np.repeat(np.arange(N), np.asarray(_sampler._poisson_from_seed(seed, rows)))
    else:
      idx = np.asarray(_sampler._indices_from_seed(seed, N))
    want = (cw.auroc(c[idx], ok[idx]), cw.fpr_at_tpr(c[idx], ok[idx], 0.95),
            cw.average_precision(c[idx], ok[idx]),
            cw.average_precision(c[idx], ok[idx], positive="error"),
            cw.smooth_ece(c[idx], ok[idx]), cw.classwise_ece(probs[idx], labels[idx]))
    got = [float(getattr(samples, name)[b]) for name in PEERS]
    np.testing.assert_allclose(got, [float(x) for x in want], atol=2e-6)


@pytest.mark.parametrize("kind", ["distinct", "ties", "real", "one_class"])
def test_host_point_estimates_are_the_library_bit_for_bit(kind):
  """The report computes the order metrics from exact sums on the host and the smooth ECE from
  host mesh sums (no per-n compiled programs): the library's float32 values, bit for bit."""
  rng = np.random.default_rng(3)
  c = rng.beta(4.0, 1.5, 3001).astype(np.float32)
  ok = rng.random(c.size) < c
  if kind == "ties":
    c = np.round(c, 1).astype(np.float32)
  elif kind == "real":
    c = rng.normal(size=c.size) * 3.0  # float64: ordered by its own values
  elif kind == "one_class":
    ok[:] = True
  got = _metrics.peer_metrics(c, ok, Settings(), real=kind == "real")
  want = (cw.auroc(c, ok), cw.fpr_at_tpr(c, ok, 0.95), cw.average_precision(c, ok),
          cw.average_precision(c, ok, positive="error"))
  if kind != "real":
    want += (cw.smooth_ece(np.asarray(c, np.float32), ok),)
  for name, value in zip(PEERS, want):
    assert np.float32(getattr(got, name)).tobytes() == np.float32(value).tobytes(), name


def test_real_scores(tmp_path, capsys):
  rng = np.random.default_rng(1)
  s = rng.normal(size=N) * 4.0  # logits: far outside [0, 1]
  ok = rng.random(N) < 1 / (1 + np.exp(-s))
  path = tmp_path / "scores.csv"
  path.write_text("score,correct\n" + "".join(f"{float(a)!r},{int(b)}\n" for a, b in zip(s, ok)))
  out = tmp_path / "out"
  stdout = run(["evaluate", path, "--scores", "real", "--out", out, *BOOT], capsys)
  assert "omitted" in stdout
  m = load(out / "metrics.json")
  assert m["scores"] == "real" and "omitted" in m["note"]
  assert m["auroc"] == pytest.approx(roc_auc_score(ok, s), abs=1e-6)
  assert m["average_precision_success"] == pytest.approx(average_precision_score(ok, s), abs=1e-6)
  assert m["average_precision_error"] == pytest.approx(average_precision_score(~ok, -s), abs=1e-6)
  summary = cw.risk_coverage_summary(s, ok)
  for name in ("aurc", "eaurc", "augrc"):
    assert m[name] == pytest.approx(float(getattr(summary, name)), abs=1e-6), name
  for name in ("ece", "smooth_ece", "classwise_ece", "sweep", "aumcc", "brier", "threshold_choice"):
    assert name not in m, name
  iv = m["intervals"]
  assert set(iv["low"]) == {"accuracy", "aurc", "eaurc", "augrc", *PEERS[:4]}
  for name in iv["low"]:
    assert iv["low"][name] <= m[name] + 1e-6 and m[name] - 1e-6 <= iv["high"][name], name
  assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
      "metrics.json", "report.md", "risk_coverage.png"]


def test_real_scores_bad_value_is_one_line(tmp_path, capsys):
  path = tmp_path / "bad.csv"
  path.write_text("score,correct\n1.5,1\nnan,0\n")
  out = tmp_path / "out"
  code = cli.main(["evaluate", str(path), "--scores", "real", "--out", str(out)])
  err = capsys.readouterr().err
  assert code == 2 and "Traceback" not in err
  lines = err.strip().splitlines()
  assert len(lines) == 1 and "line 3" in lines[0] and "not a finite number" in lines[0]
  assert not out.exists()
