"""The kit's NNX metrics inside an eval step: in-place updates, one variable per metric.

``RiskCoverageMetric.update`` adds a batch by scatters into the bins it touches
(``_risk_coverage_state._rc_add``) instead of merging a state of every bin: the
arrays must equal ``merge(from_model_output(...))`` bit for bit, and under
``nnx.jit`` with donation XLA must write the state's buffers in place. No timing
is asserted here (benchmarks/bench_eval_step.py measures it).
"""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cwsa_jax as cw
from cwsa_jax import _exact
from cwsa_jax.streaming import CalibrationState, RiskCoverageState, SweepState

nnx = pytest.importorskip("flax.nnx")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THRESHOLDS = np.array([0.0, 0.5, 0.5, 0.9, 0.99], np.float32)


def leaves_equal(a, b) -> bool:
  return all(np.asarray(x).shape == np.asarray(y).shape
             and np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def batches(seed=0):
  """Batches of every kind an update takes: boolean and graded correctness, bool and float
  masks, ties (rounded confidences), 0 and 1, one sample, [rows, n] leading axes."""
  rng = np.random.default_rng(seed)
  out = []
  for i, n in enumerate([500, 1, 37, 1200, 64]):
    c = rng.uniform(0, 1, n).astype(np.float32)
    c[: n // 2] = np.round(c[: n // 2], 2)
    c[:2] = [0.0, 1.0][:n]
    k = rng.uniform(size=n) < c
    out.append([lambda: dict(confidences=c, correct=k),
                lambda: dict(confidences=c, correct=rng.uniform(size=n).astype(np.float32)),
                lambda: dict(confidences=c, correct=k, mask=rng.uniform(size=n) < 0.6),
                lambda: dict(confidences=c, correct=k,
                             mask=(rng.uniform(size=n) < 0.3).astype(np.float32)),
                lambda: dict(confidences=c.reshape(4, 16), correct=k.reshape(4, 16))][i]())
  return out


@pytest.mark.parametrize("mantissa_bits", [8, 3, 0])
def test_in_place_update_equals_the_merge_bit_for_bit(mantissa_bits):
  Rc = RiskCoverageState.configure(mantissa_bits=mantissa_bits)
  add = jax.jit(lambda s, kw: s._add_model_output(**kw), donate_argnums=0)
  merged = eager = jitted = Rc.empty()
  for kw in batches(mantissa_bits):
    merged = merged.merge(Rc.from_model_output(**kw))
    eager = eager._add_model_output(**kw)
    jitted = add(jitted, jax.tree.map(jnp.asarray, kw))
    assert leaves_equal(eager, merged)
    assert leaves_equal(jitted, merged)
  assert leaves_equal(jitted.compute(), merged.compute())


def test_in_place_update_carries_into_the_top_limbs():
  """A state whose bins hold 2^36 units and more: the carries reach ``top`` as a merge's do."""
  Rc = RiskCoverageState.configure(mantissa_bits=2)
  state = Rc.from_batch(np.full(64, 0.3, np.float32), np.zeros(64, bool))
  for _ in range(30):
    state = state.merge(state)
  assert int(np.asarray(state.top).max()) > 0
  rng = np.random.default_rng(1)
  c = np.concatenate([np.full(100, 0.3, np.float32), rng.uniform(size=400).astype(np.float32)])
  kw = dict(confidences=c, correct=rng.uniform(size=500) < 0.5)
  want = state.merge(Rc.from_model_output(**kw))
  assert leaves_equal(state._add_model_output(**kw), want)
  assert leaves_equal(jax.jit(lambda s: s._add_model_output(**kw))(state), want)


def test_in_place_update_keeps_nan_and_capacity_marks():
  rng = np.random.default_rng(2)
  c = rng.uniform(size=300).astype(np.float32)
  k = c > 0.4
  bad = c.copy()
  bad[7] = np.nan
  add = jax.jit(lambda s, c, k: s._add_model_output(confidences=c, correct=k))
  merge = jax.jit(lambda s, c, k: s.merge(RiskCoverageState.from_model_output(confidences=c,
                                                                              correct=k)))
  empty = RiskCoverageState.empty()
  assert leaves_equal(add(empty, bad, k), merge(empty, bad, k))
  assert bool(add(empty, bad, k).invalid)
  # A marked state (every top -1) stays marked, raises eagerly and computes NaN under jit.
  state = RiskCoverageState.from_batch(c, k)
  marked = dataclasses.replace(state, top=jnp.full_like(state.top, _exact.OVER_CAPACITY))
  assert bool(jnp.all(add(marked, c, k).top == _exact.OVER_CAPACITY))
  with pytest.raises(ValueError, match="past its capacity"):
    marked._add_model_output(confidences=c, correct=k)
  assert np.isnan(float(jax.jit(lambda s: s.compute().aurc)(add(marked, c, k))))


def test_a_state_past_capacity_but_unmarked_computes_nan_and_refuses_eagerly():
  """In-place updates skip the full pass of a merge's seal: compute() checks the column
  totals itself, so a state carried past its capacity never gives a wrapped number."""
  state = RiskCoverageState.from_batch(np.array([0.3, 0.7], np.float32), np.array([True, False]))
  top = state.top.at[0, 0].set(_exact.TOP_CAPACITY).at[1, 0].set(1 << 20)  # unmarked, over
  state = dataclasses.replace(state, top=top)
  assert np.isnan(float(jax.jit(lambda s: s.compute().aurc)(state)))
  with pytest.raises(ValueError, match="past its capacity"):
    state.compute()
  with pytest.raises(ValueError, match="past its capacity"):
    state.merge(RiskCoverageState.empty())


def test_each_metric_is_one_variable_without_its_thresholds():
  from cwsa_jax.nnx import CalibrationMetric, RiskCoverageMetric, SweepMetric, ThresholdMetric
  for metric, state in [(SweepMetric(THRESHOLDS), SweepState.configure(thresholds=THRESHOLDS)),
                        (ThresholdMetric(0.5), SweepState.at(0.5)),
                        (CalibrationMetric(10), CalibrationState.configure(num_bins=10)),
                        (RiskCoverageMetric(4), RiskCoverageState.configure(mantissa_bits=4))]:
    variables = jax.tree.leaves(nnx.state(metric), is_leaf=lambda x: isinstance(x, nnx.Variable))
    assert len(variables) == 1
    empty = state.empty()
    assert len(jax.tree.leaves(nnx.state(metric))) == len(jax.tree.leaves(empty)) - (
        1 if isinstance(empty, SweepState) else 0)
    assert leaves_equal(metric.streaming_state(), empty)
    assert type(metric.streaming_state()) is state


def make_metrics():
  from cwsa_jax.nnx import CalibrationMetric, RiskCoverageMetric, SweepMetric
  return nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"),
                         sweep=SweepMetric(THRESHOLDS), ece=CalibrationMetric(15),
                         aurc=RiskCoverageMetric())


def test_donated_eval_step_updates_the_state_in_place_and_exactly():
  from cwsa_jax.nnx import RiskCoverageMetric
  rng = np.random.default_rng(3)
  logits = jnp.asarray(rng.normal(size=(3, 200, 10)) * 3, jnp.float32)
  labels = jnp.asarray(rng.integers(0, 10, (3, 200)), jnp.int32)
  c, k = cw.confidences_from_logits(logits.reshape(-1, 10), labels.reshape(-1))

  def eval_step(metrics, exact, logits, labels, c, k):
    loss = jnp.mean(jax.nn.logsumexp(logits, -1)
                    - jnp.take_along_axis(logits, labels[:, None], -1)[:, 0])
    metrics.update(logits=logits, labels=labels, loss=loss)
    exact.update(confidences=c, correct=k)

  donated, kept = (make_metrics(), RiskCoverageMetric()), (make_metrics(), RiskCoverageMetric())
  step_donated = nnx.jit(eval_step, donate_argnums=(0, 1))
  step_kept = nnx.jit(eval_step)
  batch = lambda i: (logits[i], labels[i], c[200 * i:200 * (i + 1)], k[200 * i:200 * (i + 1)])  # noqa: E731
  step_donated(*donated, *batch(0))
  pointers = [x.unsafe_buffer_pointer() for x in donated[0].aurc.arrays.get_value()[:3]]
  for i in range(1, 3):
    step_donated(*donated, *batch(i))
  for i in range(3):
    step_kept(*kept, *batch(i))
  # XLA wrote the risk-coverage sums into the donated buffers (no new 2.6 MB state).
  assert [x.unsafe_buffer_pointer() for x in donated[0].aurc.arrays.get_value()[:3]] == pointers
  assert leaves_equal(donated[0].compute(), kept[0].compute())
  # Confidences passed in equal the one-pass state (the step's fused softmax may round a
  # confidence differently from the eager one).
  for _, exact in (donated, kept):
    assert leaves_equal(exact.streaming_state(), RiskCoverageState.from_batch(c, k))
    assert leaves_equal(exact.compute(), RiskCoverageState.from_batch(c, k).compute())


@pytest.mark.slow  # a benchmark smoke run in a subprocess
def test_bench_eval_step_quick_emits_its_json(tmp_path):
  out = tmp_path / "eval_step.json"
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, "benchmarks", "bench_eval_step.py"), "--quick",
       "--batch-sizes", "16", "--hidden", "8", "--out", str(out)],
      capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  record = json.loads(out.read_text())
  assert record["benchmark"] == "eval_step"
  assert {(r["variant"], r["donate"]) for r in record["steps"]} == {
      (v, d) for v in ("base", "kit") for d in (False, True)}
  assert all(r["min_s"] > 0 and r["ratio_to_base_paired_median"] > 0 for r in record["steps"])
  assert {r["variant"] for r in record["first_calls"]} == {"base", "kit"}
  assert all(r["first_step_s"] > 0 and r["first_compute_s"] > 0 for r in record["first_calls"])
