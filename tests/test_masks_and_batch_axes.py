"""Issue 45 items 4-6: nnx-style masks, leading batch axes and clu's full protocol.

* Masks are what ``nnx.metrics`` takes: bool, integer or float, broadcastable to the
  samples' shape, nonzero keeps a sample. Every such mask gives bit for bit the state of
  the boolean mask, which is the state of the kept samples alone.
* ``from_model_output`` and the nnx metrics' ``update`` treat every leading axis as samples
  of one stream: [4, 16] equals the flattened [64].
* clu: ``compute_value`` / ``Collection.compute_values()`` give ``clu.values.Scalar`` s
  that ``write_values`` writes; ``SweepState.at`` is the one-threshold scalar metric.

Two sample shapes only ([64] and [4, 16]) and the kept subset [KEPT]: few compilations.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cwsa_jax as cw
from cwsa_jax.streaming import CalibrationState, RiskCoverageState, SweepState

N, ROWS, K = 64, 4, 4
THRESHOLDS = np.array([0.0, 0.5, 0.3, 0.5, 0.9], np.float32)  # unsorted, a duplicate
STATES = {
    "sweep": SweepState.configure(thresholds=THRESHOLDS),
    "calibration": CalibrationState.configure(num_bins=10),
    "risk_coverage": RiskCoverageState.configure(mantissa_bits=6),
}


def data(seed=0):
  """Logits [N, K], labels, their (confidences, correct) and a mask keeping KEPT samples."""
  rng = np.random.default_rng(seed)
  logits = (rng.normal(size=(N, K)) * 2.0).astype(np.float32)
  labels = rng.integers(0, K, N).astype(np.int32)
  c, k = (np.asarray(x) for x in cw.confidences_from_logits(logits, labels))
  keep = np.zeros(N, bool)
  keep[rng.permutation(N)[:40]] = True
  return logits, labels, c, k, keep


KEPT = 40


def assert_same_state(a, b):
  assert type(a) is type(b)
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
    x, y = np.asarray(x), np.asarray(y)
    assert x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x, y)


def assert_same_result(a, b):
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
    x, y = np.asarray(x), np.asarray(y)
    assert x.shape == y.shape and np.array_equal(x, y, equal_nan=True)


# --------------------------------------------------------------------------- masks


@pytest.mark.parametrize("kind", list(STATES))
def test_every_mask_dtype_gives_the_boolean_masks_state_and_the_kept_samples_state(kind):
  State = STATES[kind]
  _, _, c, k, keep = data(1)
  want = State.from_batch(c, k, mask=keep)
  assert_same_state(want.merge(State.empty()), State.from_batch(c[keep], k[keep]))
  weights = np.where(keep, np.float32(0.25), 0.0) * np.where(np.arange(N) % 2, 1, -8)
  for mask in (keep.astype(np.float32), keep.astype(np.int32), keep.astype(np.uint8),
               weights.astype(np.float32),  # any nonzero keeps: not a weight
               jnp.asarray(keep, jnp.bfloat16), keep.tolist()):
    assert_same_state(State.from_batch(c, k, mask=mask), want)
  # Broadcast masks: a scalar keeps or drops all.
  assert_same_state(State.from_batch(c, k, mask=1.0), State.from_batch(c, k, mask=np.ones(N, bool)))
  assert_same_state(State.from_batch(c, k, mask=np.float32(0)).merge(State.empty()),
                    State.empty())
  # ... and a row mask [4, 1] or a column mask [16] over [4, 16] samples (batch axes kept).
  c2, k2 = c.reshape(ROWS, -1), k.reshape(ROWS, -1)
  rows = np.array([[1.0], [0.0], [2.0], [0.0]], np.float32)
  columns = keep[:N // ROWS].astype(np.int8)
  assert_same_state(State.from_batch(c2, k2, mask=rows),
                    State.from_batch(c2, k2, mask=np.broadcast_to(rows != 0, c2.shape)))
  assert_same_state(State.from_batch(c2, k2, mask=columns),
                    State.from_batch(c2, k2, mask=np.broadcast_to(columns != 0, c2.shape)))


@pytest.mark.parametrize("kind", list(STATES))
def test_masks_under_jit_and_all_masked_batches(kind):
  State = STATES[kind]
  _, _, c, k, keep = data(2)
  build = jax.jit(lambda c, k, m: State.from_batch(c, k, mask=m))
  want = State.from_batch(c, k, mask=keep)
  assert_same_state(build(c, k, keep.astype(np.float32)), want)
  assert_same_state(build(c, k, keep), want)
  # A batch of padding only changes nothing: the state of no samples.
  for mask in (np.zeros(N, np.float32), np.zeros(N, bool)):
    nothing = build(c, k, mask)
    assert_same_state(nothing.merge(State.empty()), State.empty())
    assert_same_state(nothing.merge(want), want.merge(State.empty()))
  # Padding may hold anything, even invalid values.
  bad = np.where(keep, c, np.nan).astype(np.float32)
  assert_same_state(build(bad, k, keep.astype(np.float32)), want)


@pytest.mark.parametrize("kind", list(STATES))
def test_nan_or_infinite_mask_raises_eagerly_and_poisons_under_jit(kind):
  State = STATES[kind]
  _, _, c, k, keep = data(3)
  for value, match in ((np.nan, "mask contains 1 NaN"), (np.inf, "mask contains 1 NaN or inf")):
    mask = np.where(np.arange(N) == 5, value, keep).astype(np.float32)
    with pytest.raises(ValueError, match=match):
      State.from_batch(c, k, mask=mask)
    state = jax.jit(lambda c, k, m: State.from_batch(c, k, mask=m))(c, k, mask)
    assert bool(state.invalid)
    merged = state.merge(State.from_batch(c, k))  # invalid for good
    result = merged.compute()
    result = result[1:] if kind == "sweep" else result  # all but the thresholds
    values = [np.asarray(x) for x in jax.tree_util.tree_leaves(result)
              if jnp.issubdtype(np.asarray(x).dtype, jnp.floating)]
    assert all(np.all(np.isnan(v)) for v in values)
  with pytest.raises(TypeError, match="mask must be a boolean, integer or float"):
    State.from_batch(c, k, mask=np.array(["yes"] * N))
  with pytest.raises(ValueError, match=r"mask must be broadcastable to confidences.shape = \(64,\)"):
    State.from_batch(c, k, mask=np.ones((2, N), bool))


# --------------------------------------------------------------------------- leading axes


@pytest.mark.parametrize("kind", list(STATES))
def test_model_outputs_with_leading_axes_are_one_stream(kind):
  State = STATES[kind]
  logits, labels, c, k, keep = data(4)
  probs = np.asarray(jax.nn.softmax(logits, axis=-1))
  flat = State.from_model_output(confidences=c, correct=k, mask=keep)
  grid = lambda x: x.reshape((ROWS, -1) + x.shape[1:])
  for outputs in (dict(confidences=grid(c), correct=grid(k)),
                  dict(logits=grid(logits), labels=grid(labels)),
                  dict(probs=grid(probs), labels=grid(labels))):
    got = State.from_model_output(**outputs, mask=grid(keep).astype(np.float32), loss=1.0)
    assert_same_state(got, flat)
  # A mask broadcast over the leading axis; and the same under jit.
  columns = keep[:N // ROWS]
  tiled = np.tile(columns, ROWS)
  step = jax.jit(lambda lg, lb, m: State.from_model_output(logits=lg, labels=lb, mask=m))
  assert_same_state(step(grid(logits), grid(labels), columns.astype(np.int32)),
                    State.from_model_output(logits=logits, labels=labels, mask=tiled))
  # from_batch keeps its batch axes (one state per row); reduce() merges them.
  rows = State.from_batch(grid(c), grid(k), mask=grid(keep))
  assert rows.invalid.shape == (ROWS,)
  assert_same_state(rows.reduce(), flat)


# --------------------------------------------------------------------------- nnx


def test_nnx_metrics_take_float_masks_and_leading_axes():
  from flax import nnx

  from cwsa_jax.nnx import CalibrationMetric, RiskCoverageMetric, SweepMetric, ThresholdMetric
  logits, labels, c, k, keep = data(5)
  make = lambda: nnx.MultiMetric(
      accuracy=nnx.metrics.Accuracy(), sweep=SweepMetric(THRESHOLDS), cwsa=ThresholdMetric(0.5),
      ece=CalibrationMetric(10), aurc=RiskCoverageMetric(mantissa_bits=6))
  grid = lambda x: jnp.asarray(x.reshape((ROWS, -1) + x.shape[1:]))
  step = nnx.jit(lambda m, lg, lb, mask: m.update(logits=lg, labels=lb, mask=mask, loss=0.0))
  # Two updates: [4, 16] with a float mask (the one nnx's Accuracy takes too), under nnx.jit,
  # and the flattened [64] with the boolean mask, eagerly.
  grid_metrics, flat_metrics = make(), make()
  for _ in range(2):
    step(grid_metrics, grid(logits), grid(labels), grid(keep.astype(np.float32)))
    flat_metrics.update(logits=logits, labels=labels, mask=keep)
  got, flat = grid_metrics.compute(), flat_metrics.compute()
  for name in ("sweep", "cwsa", "ece", "aurc"):
    assert_same_result(got[name], flat[name])
  # ... which is the metric of the kept samples alone (each twice).
  ck, kk = np.concatenate([c[keep]] * 2), np.concatenate([k[keep]] * 2)
  assert_same_result(got["sweep"], cw.sweep(ck, kk, THRESHOLDS))
  assert float(got["cwsa"]) == float(cw.sweep(ck, kk, [0.5]).cwsa[0])
  assert np.asarray(got["cwsa"]).shape == ()
  assert float(got["ece"]) == float(CalibrationState.from_batch(ck, kk, num_bins=10).compute())
  assert_same_result(got["aurc"], RiskCoverageState.from_batch(ck, kk, mantissa_bits=6).compute())
  assert float(got["accuracy"]) == pytest.approx(float(np.mean(k[keep])))
  # An all-masked update changes nothing; a NaN mask entry under jit makes the metrics NaN.
  step(grid_metrics, grid(logits), grid(labels), jnp.zeros((ROWS, N // ROWS)))
  assert_same_result(grid_metrics.compute()["sweep"], got["sweep"])
  with pytest.raises(ValueError, match="mask contains 1 NaN"):
    grid_metrics.sweep.update(logits=grid(logits), labels=grid(labels),
                                 mask=grid(np.where(np.arange(N) == 0, np.nan, 1.0)))
  step(grid_metrics, grid(logits), grid(labels), grid(np.where(np.arange(N) == 0, np.nan, 1.0)))
  out = grid_metrics.compute()
  assert np.all(np.isnan(np.asarray(out["sweep"].cwsa))) and np.isnan(float(out["cwsa"]))
  assert np.isnan(float(out["ece"])) and np.isnan(float(out["aurc"].aurc))


def test_threshold_metric_validates_and_donates():
  from flax import nnx

  from cwsa_jax.nnx import ThresholdMetric
  with pytest.raises(ValueError, match="metric must be one of"):
    ThresholdMetric(0.5, metric="accuracy")
  with pytest.raises(ValueError, match="tau|thresholds"):
    ThresholdMetric(1.0)
  metric = ThresholdMetric(0.5, metric="coverage")

  @nnx.jit(donate_argnums=0)
  def step(metric, c, k):
    metric.update(confidences=c, correct=k)

  _, _, c, k, _ = data(6)
  step(metric, jnp.asarray(c), jnp.asarray(k))
  assert float(metric.compute()) == float(cw.coverage(c, 0.5))


# --------------------------------------------------------------------------- clu


def test_clu_collection_compute_values_and_write_values():
  from clu import metrics as clu_metrics
  from clu import values as clu_values
  logits, labels, c, k, keep = data(7)
  Metrics = clu_metrics.Collection.create(
      cwsa=SweepState.at(0.5), coverage=SweepState.at(0.5, metric="coverage"),
      ece=STATES["calibration"], aurc=STATES["risk_coverage"],
      augrc=RiskCoverageState.configure(mantissa_bits=6, metric="augrc"),
      loss=clu_metrics.Average.from_output("loss"))
  grid = lambda x: jnp.asarray(x.reshape((ROWS, -1) + x.shape[1:]))
  step = jax.jit(lambda m, lg, lb, mask: m.merge(Metrics.single_from_model_output(
      logits=lg, labels=lb, mask=mask, loss=jnp.float32(0.5))))
  metrics = Metrics.empty()
  for _ in range(2):
    metrics = step(metrics, grid(logits), grid(labels), grid(keep.astype(np.float32)))
  values = metrics.compute_values()
  # Scalars of 0-d values: what clu.metric_writers.write_values sends to write_scalars.
  assert all(isinstance(v, clu_values.Scalar) and np.ndim(v.value) == 0 for v in values.values())
  ck, kk = np.concatenate([c[keep]] * 2), np.concatenate([k[keep]] * 2)
  rc = RiskCoverageState.from_batch(ck, kk, mantissa_bits=6).compute()
  want = dict(cwsa=cw.sweep(ck, kk, [0.5]).cwsa[0], coverage=cw.sweep(ck, kk, [0.5]).coverage[0],
              ece=CalibrationState.from_batch(ck, kk, num_bins=10).compute(),
              aurc=rc.aurc, augrc=rc.augrc, loss=0.5)
  assert {name: float(v.value) for name, v in values.items()} == \
      {name: float(v) for name, v in want.items()}
  # compute() gives the same scalars for the scalar metric; compute_values() traces under jit.
  assert float(metrics.compute()["cwsa"]) == float(want["cwsa"])
  jitted = jax.jit(lambda m: {name: v.value for name, v in m.compute_values().items()})(metrics)
  assert {name: float(v) for name, v in jitted.items()} == {name: float(v) for name, v in want.items()}


def test_compute_value_of_arrays_says_what_to_use():
  _, _, c, k, _ = data(8)
  with pytest.raises(TypeError, match=r"SweepState.at\(tau"):
    STATES["sweep"].from_batch(c, k).compute_value()
  with pytest.raises(ValueError, match=r"batch shape \(4,\): reduce\(\) it first"):
    STATES["calibration"].from_batch(c.reshape(ROWS, -1), k.reshape(ROWS, -1)).compute_value()
  with pytest.raises(ValueError, match="metric must be one of"):
    SweepState.at(0.5, metric="accuracy")
  with pytest.raises(ValueError, match="metric must be one of"):
    RiskCoverageState.configure(metric="exact")
  # One class per options; at() states merge with the plain states of the same threshold.
  Cwsa = SweepState.at(0.5)
  assert Cwsa is SweepState.at(np.float32(0.5)) and issubclass(Cwsa, SweepState)
  state = Cwsa.from_batch(c, k).merge(SweepState.from_batch(c, k, [0.5]))
  assert float(state.compute()) == float(cw.sweep(np.tile(c, 2), np.tile(k, 2), [0.5]).cwsa[0])
