"""Flax NNX metrics (cwsa_jax.nnx) and clu's Metric protocol on the streaming states.

Exact states: after any number of updates the metric equals the one-shot function bit for bit.
The multi-device test runs this file as a script in a subprocess with 4 CPU devices.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cwsa_jax as cw
from cwsa_jax.streaming import CalibrationState, RiskCoverageState, SweepState

THRESHOLDS = np.array([0.0, 0.3, 0.5, 0.5, 0.75, 0.9, 0.99], np.float32)  # unsorted-safe, a duplicate
SWEEP_FIELDS = ("thresholds", "coverage", "selective_accuracy", "cwsa", "cwsa_plus")
RC_FIELDS = ("aurc", "aurc_low", "aurc_high", "augrc", "augrc_low", "augrc_high", "exact")


def data(seed=0, n=600, classes=4):
  """Logits, labels, and their (confidences, correct), with ties at 0, 1 and at thresholds."""
  rng = np.random.default_rng(seed)
  logits = (rng.normal(size=(n, classes)) * 2.5).astype(np.float32)
  labels = rng.integers(0, classes, n).astype(np.int32)
  c, k = (np.asarray(x) for x in cw.confidences_from_logits(logits, labels))
  c = c.copy()
  c[:30] = np.repeat(np.array([0.0, 1.0, 0.5, 0.9, 0.3, 0.75], np.float32), 5)
  return logits, labels, c, k


def assert_same(a, b, fields):
  for f in fields:
    x, y = np.asarray(getattr(a, f)), np.asarray(getattr(b, f))
    assert x.shape == y.shape and np.array_equal(x, y, equal_nan=True), f


def splits(n, parts=3):
  """Equal parts (one compilation); tests/test_streaming.py covers random uneven splits."""
  edges = np.linspace(0, n, parts + 1).astype(int)
  return [slice(a, b) for a, b in zip(edges[:-1], edges[1:])]


# --------------------------------------------------------------------------- nnx metrics


def test_metrics_after_several_updates_equal_the_one_shot_functions():
  from cwsa_jax.nnx import CalibrationMetric, RiskCoverageMetric, SweepMetric
  _, _, c, k = data()
  sweep_metric, cal_metric, rc_metric = SweepMetric(THRESHOLDS), CalibrationMetric(10), \
      RiskCoverageMetric(mantissa_bits=6)
  for part in splits(len(c)):
    for metric in (sweep_metric, cal_metric, rc_metric):
      metric.update(confidences=c[part], correct=k[part], loss=1.0, images=None)  # extra kwargs ignored
  assert_same(sweep_metric.compute(), cw.sweep(c, k, THRESHOLDS), SWEEP_FIELDS)
  # The ECE state is exact: the metric equals the one-pass state bit for bit, and cw.ece to
  # float32 rounding (ece sums floats, the state integers).
  one_pass = CalibrationState.from_batch(c, k, num_bins=10)
  assert float(cal_metric.compute()) == float(one_pass.compute())
  assert float(cal_metric.compute()) == pytest.approx(float(cw.ece(c, k, num_bins=10)), abs=2e-6)
  assert_same(rc_metric.compute(), RiskCoverageState.from_batch(c, k, mantissa_bits=6).compute(),
              RC_FIELDS)


def test_graded_correctness_and_options():
  from cwsa_jax.nnx import CalibrationMetric, SweepMetric
  _, _, c, _ = data(1)
  kappa = np.random.default_rng(1).uniform(size=c.shape).astype(np.float32)
  metric = SweepMetric(THRESHOLDS, graded=True, normalize="all")
  mce = CalibrationMetric(7, norm="max")
  for part in splits(len(c)):
    metric.update(confidences=c[part], correct=kappa[part])
    mce.update(confidences=c[part], correct=kappa[part])
  assert_same(metric.compute(), cw.sweep(c, kappa, THRESHOLDS, normalize="all"), SWEEP_FIELDS)
  assert float(mce.compute()) == float(CalibrationState.from_batch(c, kappa, num_bins=7)
                                       .compute(norm="max"))


def test_logits_labels_and_mask():
  from cwsa_jax.nnx import SweepMetric
  logits, labels, c, k = data(2)
  c, k = (np.asarray(x) for x in cw.confidences_from_logits(logits, labels))
  from_logits = SweepMetric(THRESHOLDS)
  masked = SweepMetric(THRESHOLDS)
  keep = np.random.default_rng(2).uniform(size=len(c)) < 0.6
  for part in splits(len(c)):
    from_logits.update(logits=logits[part], labels=labels[part])
    masked.update(confidences=c[part], correct=k[part], mask=keep[part])
  assert_same(from_logits.compute(), cw.sweep(c, k, THRESHOLDS), SWEEP_FIELDS)
  assert_same(masked.compute(), cw.sweep(c[keep], k[keep], THRESHOLDS), SWEEP_FIELDS)


def test_reset_clears():
  from cwsa_jax.nnx import CalibrationMetric, SweepMetric
  _, _, c, k = data(3)
  metric, cal = SweepMetric(THRESHOLDS), CalibrationMetric()
  fresh = metric.compute()
  metric.update(confidences=c[:100], correct=k[:100])
  cal.update(confidences=c[:100], correct=k[:100])
  assert float(metric.compute().coverage[0]) == 1.0
  metric.reset()
  cal.reset()
  assert not np.any(np.asarray(metric.streaming_state().hi))
  assert_same(metric.compute(), fresh, SWEEP_FIELDS)
  assert np.isnan(float(metric.compute().coverage[0]))
  assert np.isnan(float(cal.compute()))
  metric.update(confidences=c[100:], correct=k[100:])
  assert_same(metric.compute(), cw.sweep(c[100:], k[100:], THRESHOLDS), SWEEP_FIELDS)


def test_multimetric_inside_nnx_jit_compiles_once():
  from flax import nnx

  from cwsa_jax.nnx import CalibrationMetric, RiskCoverageMetric, SweepMetric
  logits, labels, _, _ = data(4, n=480)
  c, k = (np.asarray(x) for x in cw.confidences_from_logits(logits, labels))
  metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"),
                            sweep=SweepMetric(THRESHOLDS), ece=CalibrationMetric(10),
                            aurc=RiskCoverageMetric(mantissa_bits=6))
  traces = []

  @nnx.jit
  def eval_step(metrics, logits, labels):
    traces.append(1)
    loss = jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, labels[:, None], -1)[:, 0])
    metrics.update(logits=logits, labels=labels, loss=loss)

  for start in range(0, 480, 120):
    eval_step(metrics, jnp.asarray(logits[start:start + 120]), jnp.asarray(labels[start:start + 120]))
  assert len(traces) == 1
  out = metrics.compute()
  assert_same(out["sweep"], cw.sweep(c, k, THRESHOLDS), SWEEP_FIELDS)
  assert float(out["ece"]) == float(CalibrationState.from_batch(c, k, num_bins=10).compute())
  assert_same(out["aurc"], RiskCoverageState.from_batch(c, k, mantissa_bits=6).compute(), RC_FIELDS)
  assert float(out["accuracy"]) == pytest.approx(float(np.mean(k)), abs=1e-6)
  metrics.reset()
  assert np.isnan(float(metrics.compute()["ece"]))


def test_update_names_the_missing_outputs():
  from cwsa_jax.nnx import SweepMetric
  metric = SweepMetric(THRESHOLDS)
  with pytest.raises(TypeError, match="confidences= and correct=, or logits= and labels="):
    metric.update(loss=1.0)
  with pytest.raises(TypeError, match="both confidences= and correct="):
    metric.update(confidences=np.array([0.5], np.float32), labels=np.array([0]))


# --------------------------------------------------------------------------- clu protocol


def test_configured_states_follow_clus_protocol():
  with pytest.raises(TypeError, match=r"SweepState.configure\(thresholds=...\)"):
    SweepState.empty()
  Sweep = SweepState.configure(thresholds=THRESHOLDS)
  assert Sweep is SweepState.configure(thresholds=list(THRESHOLDS))  # one class per options
  assert issubclass(Sweep, SweepState) and Sweep is not SweepState
  _, _, c, k = data(5)
  state = Sweep.empty()
  for part in splits(len(c)):
    state = state.merge(Sweep.from_model_output(confidences=c[part], correct=k[part], loss=3.0))
  assert type(state) is Sweep
  assert_same(state.compute(), cw.sweep(c, k, THRESHOLDS), SWEEP_FIELDS)
  Cal = CalibrationState.configure(num_bins=8, norm="l2")
  cal = Cal.empty().merge(Cal.from_model_output(confidences=c, correct=k))
  assert type(cal) is Cal and cal.num_bins == 8
  assert float(cal.compute()) == float(CalibrationState.from_batch(c, k, num_bins=8).compute(norm="l2"))
  with pytest.raises(ValueError, match="num_bins"):
    CalibrationState.configure(num_bins=0)


def test_clu_collection_holds_the_states():
  from clu import metrics as clu_metrics
  logits, labels, _, _ = data(6, n=400)
  c, k = (np.asarray(x) for x in cw.confidences_from_logits(logits, labels))
  Metrics = clu_metrics.Collection.create(
      sweep=SweepState.configure(thresholds=THRESHOLDS, normalize="all"),
      ece=CalibrationState.configure(num_bins=10), aurc=RiskCoverageState.configure(mantissa_bits=6),
      loss=clu_metrics.Average.from_output("loss"))
  step = jax.jit(lambda lg, lb: Metrics.single_from_model_output(logits=lg, labels=lb,
                                                                 loss=jnp.float32(2.0)))
  metrics = Metrics.empty()
  for start in range(0, 400, 100):
    metrics = metrics.merge(step(logits[start:start + 100], labels[start:start + 100]))
  out = metrics.compute()
  assert_same(out["sweep"], cw.sweep(c, k, THRESHOLDS, normalize="all"), SWEEP_FIELDS)
  assert float(out["ece"]) == float(CalibrationState.from_batch(c, k, num_bins=10).compute())
  assert_same(out["aurc"], RiskCoverageState.from_batch(c, k, mantissa_bits=6).compute(), RC_FIELDS)
  assert float(out["loss"]) == 2.0
  # clu's reduce() after stacking (what its all_gather path does): the thresholds stack too.
  stacked = jax.tree.map(lambda *x: jnp.stack(x), *[
      Metrics.single_from_model_output(logits=logits[s], labels=labels[s], loss=jnp.float32(1.0))
      for s in (slice(0, 200), slice(200, 400))])
  assert_same(stacked.reduce().compute()["sweep"], out["sweep"], SWEEP_FIELDS)


# --------------------------------------------------------------------------- training


def test_training_evaluation_metrics_equal_one_pass():
  from cwsa_jax.training import train
  rng = np.random.default_rng(7)
  probs = np.asarray(jax.nn.softmax(rng.normal(size=(300, 10)).astype(np.float32) * 3))
  labels = rng.integers(0, 10, 300).astype(np.int32)
  metrics = train.make_evaluation_metrics(THRESHOLDS)
  for start in range(0, 300, 128):  # a ragged last batch, as the test split has
    train._update_evaluation(metrics, jnp.asarray(probs[start:start + 128]),
                             jnp.asarray(labels[start:start + 128]))
  summary = train.evaluate_predictions(probs, labels, metrics.compute())
  c, k = cw.confidences_from_probs(probs, labels)
  ref = cw.sweep(c, k, THRESHOLDS)
  as_list = lambda x: [None if not np.isfinite(v) else float(v) for v in np.asarray(x)]
  for field in ("coverage", "selective_accuracy", "cwsa", "cwsa_plus"):
    assert summary["sweep"][field] == as_list(getattr(ref, field)), field
  assert summary["ece"] == pytest.approx(float(cw.ece(c, k)), abs=2e-6)
  assert summary["test_accuracy"] == pytest.approx(float(np.mean(np.asarray(k))), abs=1e-6)
  assert summary["aurc"] == float(cw.aurc(c, k))
  for tau in (0.5, 0.9):
    assert summary["cwsa"][str(tau)] == pytest.approx(float(cw.cwsa(c, k, tau)), abs=1e-6)
    assert summary["at_threshold"][str(tau)]["coverage"] == pytest.approx(float(cw.coverage(c, tau)),
                                                                          abs=1e-7)


# --------------------------------------------------------------------------- 4 devices


@pytest.mark.slow
def test_shard_map_psum_and_sharded_jit_on_four_devices():
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
  env["JAX_PLATFORMS"] = "cpu"
  proc = subprocess.run([sys.executable, __file__, "--multidevice"], env=env, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  checks = json.loads(proc.stdout.strip().splitlines()[-1])
  assert len(checks) == 5
  failed = [name for name, ok in checks.items() if not ok]
  assert not failed, f"failed checks: {failed}"


def _multidevice_checks() -> dict:
  from clu import metrics as clu_metrics
  from flax import nnx
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from cwsa_jax.nnx import CalibrationMetric, SweepMetric

  checks = {"devices": len(jax.devices()) == 4}
  mesh = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  logits, labels, _, _ = data(8, n=800)
  c, k = (np.asarray(x) for x in cw.confidences_from_logits(logits, labels))
  ref = cw.sweep(c, k, THRESHOLDS)
  same = lambda r: all(np.array_equal(np.asarray(getattr(r, f)), np.asarray(getattr(ref, f)),
                                      equal_nan=True) for f in SWEEP_FIELDS)
  batches = [slice(0, 400), slice(400, 800)]

  # nnx.shard_map: each device adds its shard, all-reduced over "data" (update(axis_name=...)).
  metric, cal = SweepMetric(THRESHOLDS), CalibrationMetric(10)

  @nnx.jit
  @nnx.shard_map(mesh=mesh, in_specs=(P(), P(), P("data"), P("data")), out_specs=None)
  def sharded_update(metric, cal, logits, labels):
    metric.update(logits=logits, labels=labels, axis_name="data")
    cal.update(logits=logits, labels=labels, axis_name="data")

  for s in batches:
    sharded_update(metric, cal, logits[s], labels[s])
  checks["nnx_shard_map_psum_equals_one_pass"] = same(metric.compute()) and float(cal.compute()) \
      == float(CalibrationState.from_batch(c, k, num_bins=10).compute())

  # nnx.jit on inputs sharded over 4 devices (XLA partitions the update).
  gspmd = SweepMetric(THRESHOLDS)
  step = nnx.jit(lambda m, lg, lb: m.update(logits=lg, labels=lb))
  shard = NamedSharding(mesh, P("data"))
  for s in batches:
    step(gspmd, jax.device_put(logits[s], shard), jax.device_put(labels[s], shard))
  checks["nnx_jit_sharded_inputs_equals_one_pass"] = same(gspmd.compute())

  # clu: from_model_output(...).psum inside jax.shard_map, and clu's own all_gather + reduce path.
  Sweep = SweepState.configure(thresholds=THRESHOLDS)
  psummed = jax.jit(jax.shard_map(
      lambda lg, lb: Sweep.from_model_output(logits=lg, labels=lb).psum("data"),
      mesh=mesh, in_specs=(P("data"), P("data")), out_specs=P()))
  state = Sweep.empty()
  for s in batches:
    state = state.merge(psummed(logits[s], labels[s]))
  checks["clu_state_psum_equals_one_pass"] = same(state.compute())
  Metrics = clu_metrics.Collection.create(sweep=Sweep)
  gathered = jax.jit(jax.shard_map(  # clu's all_gather predates shard_map's replication check
      lambda lg, lb: Metrics.gather_from_model_output(logits=lg, labels=lb, axis_name="data"),
      mesh=mesh, in_specs=(P("data"), P("data")), out_specs=P(), check_vma=False))
  collection = Metrics.empty()
  for s in batches:
    collection = collection.merge(gathered(logits[s], labels[s]))
  checks["clu_collection_gather_equals_one_pass"] = same(collection.compute()["sweep"])
  return checks


if __name__ == "__main__" and sys.argv[1:] == ["--multidevice"]:
  print(json.dumps({name: bool(ok) for name, ok in _multidevice_checks().items()}))


def test_metrics_update_under_nnx_jit_with_donation():
  """A fresh or reset metric owns one buffer per array: donating it to nnx.jit works."""
  from flax import nnx

  from cwsa_jax.nnx import CalibrationMetric, RiskCoverageMetric, SweepMetric
  metrics = nnx.MultiMetric(sweep=SweepMetric([0.5, 0.7]), ece=CalibrationMetric(15),
                            aurc=RiskCoverageMetric())

  @nnx.jit(donate_argnums=0)
  def step(metrics, c, k):
    metrics.update(confidences=c, correct=k)

  c = jnp.asarray(np.random.default_rng(0).random(100).astype(np.float32))
  for _ in range(2):
    step(metrics, c, c > 0.4)
  want = cw.sweep(jnp.concatenate([c, c]), jnp.concatenate([c, c]) > 0.4, jnp.array([0.5, 0.7]))
  np.testing.assert_array_equal(metrics.compute()["sweep"].coverage, want.coverage)
  metrics.reset()
  step(metrics, c, c > 0.4)


def test_metric_classes_show_their_real_signatures():
  """help() and inspect see the constructor's parameters, not flax's (*args, **kwargs)."""
  import inspect
  from cwsa_jax import nnx as cnnx
  assert list(inspect.signature(cnnx.SweepMetric).parameters) == ["thresholds", "graded",
                                                                  "normalize"]
  assert list(inspect.signature(cnnx.CalibrationMetric).parameters) == ["num_bins", "norm"]
  assert list(inspect.signature(cnnx.RiskCoverageMetric).parameters) == ["mantissa_bits"]
  assert inspect.signature(cnnx.SweepMetric.compute).return_annotation == "SweepResult"
