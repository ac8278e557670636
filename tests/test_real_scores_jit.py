"""The rank metrics on real-valued scores inside ``jax.jit`` and ``jax.vmap``, and AUMCC's
float64 thresholds.

Every rank metric depends on the scores' order alone, so inside a user's ``jit`` (and under
``vmap`` over models) float32 logits, energies or any finite scores must give the eager call's
result, which is the call on the scores' dense ranks mapped into [0, 1], and match a float64
reference written from the definitions (``reference`` where it has one, below otherwise). NaN
and infinite scores give NaN in the program; [0, 1] scores take the program they always took.
AUMCC compares confidences with thresholds: float64 inputs finer than float32 keep their
float64 comparisons, and real-valued scores stay refused.

Every case shares one shape [M, N] so that each function compiles once per form.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cwsa_jax as cw
import reference
from cwsa_jax import _order

M, N = 3, 96
SLACK = 2.0**-22  # the kit's working-point slack (a decimal target matches an equal rate)
COVERAGE, RISK, TPR = (0.3, 0.5, 1.0), (0.0, 0.2), (0.5, 0.95)

# Each metric once (an option that changes nothing about the order would only compile more),
# grouped so that a group compiles as one program; the fields are flattened to a list of arrays.
FUNCTIONS = {
    "areas": lambda s, k: [cw.aurc(s, k), cw.augrc(s, k, convention="trapezoid"),
                           cw.eaurc(s, k, convention="published_code")],
    "summary": lambda s, k: list(cw.risk_coverage_summary(s, k)),
    "curve": lambda s, k: list(cw.risk_coverage_curve(s, k)),
    "working_points": lambda s, k: [cw.risk_at_coverage(s, k, jnp.array(COVERAGE)),
                                    cw.coverage_at_risk(s, k, jnp.array(RISK))],
    "failure_detection": lambda s, k: [cw.auroc(s, k), cw.fpr_at_tpr(s, k, jnp.array(TPR)),
                                       cw.average_precision(s, k, positive="error")],
}
# Compiled once per function (jit caches by the wrapped function).
JITTED = {name: jax.jit(fn) for name, fn in FUNCTIONS.items()}
VMAPPED = {name: jax.jit(jax.vmap(fn)) for name, fn in FUNCTIONS.items()}


# ------------------------------------------------------------------ inputs


def _scores(kind: str) -> np.ndarray:
  """float32 [M, N] scores of one kind, with ties."""
  rng = np.random.default_rng(["logits", "energies", "unit", "extremes"].index(kind))
  if kind == "logits":  # logit-like in [-20, 20], rounded: ties
    s = np.clip(np.round(rng.normal(size=(M, N)) * 6 * 4) / 4, -20, 20)
    s[2, ::3] = 1.5  # a big tie group
  elif kind == "energies":  # negative energies, all below 0
    s = -np.round(rng.gamma(2.0, 3.0, size=(M, N)) + 0.5, 1)
  elif kind == "unit":  # in [0, 1] with 0, 1 and ties: the unchanged path
    s = np.round(rng.random((M, N)) * 16) / 16
  else:  # signed zeros, subnormals, huge values, 1 and its neighbour (orders float32 keeps)
    pool = np.array([-3e38, -20.0, -1e-40, -0.0, 0.0, 1e-45, 1e-40, 0.5, 1.0, 1.0000001,
                     7.0, 3e38], np.float32)
    s = pool[rng.integers(0, pool.size, (M, N))]
  return s.astype(np.float32)


def _correct(scores: np.ndarray) -> np.ndarray:
  rng = np.random.default_rng(11)
  k = rng.random(scores.shape) < 1 / (1 + np.exp(-np.clip(scores, -30, 30) / 4))
  k[:, 0], k[:, 1] = True, False  # both classes in every row
  return k


def _ranked(x: np.ndarray) -> np.ndarray:
  """Dense ranks of each row mapped into [0, 1] (float32 keeps them apart at these sizes)."""
  out = np.empty(x.shape, np.float32)
  for row in range(x.shape[0]):
    distinct, rank = np.unique(x[row], return_inverse=True)
    out[row] = rank.reshape(-1) / max(distinct.size - 1, 1)
  return out


KINDS = ("logits", "energies", "unit", "extremes")


# ------------------------------------------------------------------ float64 references
# ``reference`` has AURC, AUGRC, E-AURC and the curve; the working points and the failure
# detection metrics are written here, one distinct threshold at a time.


def ref_risk_at_coverage(s, k, target):
  points = reference.risk_coverage_points(s, k)  # decreasing thresholds: k grows
  for _, accepted, errors in points:
    if accepted / len(s) >= target - SLACK:
      return errors / accepted
  return np.nan


def ref_coverage_at_risk(s, k, target):
  ok = [accepted / len(s) for _, accepted, errors in reference.risk_coverage_points(s, k)
        if errors / accepted <= target + SLACK]
  return max(ok, default=0.0)


def reference_row(name, s, k):
  """The float64 reference of ``FUNCTIONS[name]`` on one row, as a list of arrays (the curve:
  its first ``num_points`` points)."""
  if name == "areas":
    return [reference.aurc(s, k, "step"), reference.aurc(s, k, "trapezoid", generalized=True),
            reference.eaurc(s, k, "published_code")]
  if name == "summary":
    return [reference.aurc(s, k, "step"), reference.aurc(s, k, "step", generalized=True),
            reference.eaurc(s, k, "step")]
  if name == "curve":
    thresholds, coverage, risk, generalized = reference.risk_coverage_curve(s, k)
    return [thresholds, coverage, risk, generalized, len(thresholds)]
  if name == "working_points":
    return [[ref_risk_at_coverage(s, k, q) for q in COVERAGE],
            [ref_coverage_at_risk(s, k, r) for r in RISK]]
  return [reference.auroc(s, k), [reference.fpr_at_tpr(s, k, q, SLACK) for q in TPR],
          reference.average_precision(s, k, "error")]


def _assert_same(got, want):
  assert len(got) == len(want)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


# ------------------------------------------------------------------ the tests


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_jit_and_vmap_equal_the_eager_call_and_the_float64_reference(name, kind):
  s = _scores(kind)
  k = _correct(s)
  eager = FUNCTIONS[name](s, k)
  _assert_same(JITTED[name](jnp.asarray(s), k), eager)
  _assert_same(VMAPPED[name](jnp.asarray(s), k), eager)  # one decision per model
  ranked = FUNCTIONS[name](_ranked(s), k)
  if name == "curve":  # its thresholds are the scores' values, not the ranks'
    eager, ranked = eager[1:], ranked[1:]
  _assert_same(eager, ranked)
  got = FUNCTIONS[name](s, k)
  for row in range(M):
    want = reference_row(name, s[row].astype(np.float64), k[row])
    if name == "curve":
      m = int(got[4][row])
      assert m == want[4]
      # The thresholds are the distinct scores themselves, in decreasing order.
      np.testing.assert_array_equal(np.asarray(got[0][row, :m]), want[0].astype(np.float32))
      for g, w in zip(got[1:4], want[1:4]):
        np.testing.assert_allclose(np.asarray(g[row, :m], np.float64), w, rtol=1e-6, atol=1e-7)
      continue
    for g, w in zip(got, want):
      np.testing.assert_allclose(np.asarray(g[row], np.float64), np.asarray(w, np.float64),
                                 rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_nan_and_infinite_scores_give_nan_in_the_program(name):
  s = _scores("logits")
  k = _correct(s)
  bad = s.copy()
  bad[0, 5] = np.nan
  bad[2, 7] = np.inf
  with pytest.raises(ValueError, match="NaN or infinite"):
    FUNCTIONS[name](bad, k)
  want = FUNCTIONS[name](s, k)
  for got in (JITTED[name](jnp.asarray(bad), k), VMAPPED[name](jnp.asarray(bad), k)):
    for g, w in zip(got, want):
      g = np.asarray(g)
      if g.dtype.kind == "f":
        assert np.all(np.isnan(g[0])) and np.all(np.isnan(g[2]))
      else:  # the curve's num_points
        assert g[0] == -1 and g[2] == -1
      np.testing.assert_array_equal(g[1], np.asarray(w)[1])  # the valid row: unchanged


def test_unit_interval_scores_take_the_unchanged_branch():
  """In the program the stand-ins are taken only where a finite score lies outside [0, 1]:
  [0, 1] scores reach the kernels bit for bit as they are (also NaN among them)."""
  stand = jax.jit(lambda x: _order.traced_stand_ins(x, with_values=True))
  unit, logits = _scores("unit"), _scores("logits")
  with_nan = unit.copy()
  with_nan[1, 2] = np.nan
  for s in (unit, with_nan):
    out = stand(jnp.asarray(s))
    assert not bool(out.taken)
    np.testing.assert_array_equal(np.asarray(out.scores).view(np.int32), s.view(np.int32))
  out = stand(jnp.asarray(logits))
  assert bool(out.taken)
  np.testing.assert_array_equal(np.asarray(out.scores), _order.stand_ins(logits)[0])
  # Under vmap each model decides for itself (the cond is a select there).
  mixed = np.stack([unit[0], logits[1], unit[2]])
  taken = jax.jit(jax.vmap(lambda x: _order.traced_stand_ins(x).taken))(jnp.asarray(mixed))
  np.testing.assert_array_equal(np.asarray(taken), [False, True, False])


def test_curve_thresholds_of_real_scores_move_with_the_scores():
  """The curve's thresholds are the scores' values in the program too, with derivative 1
  (distinct scores: each point once, the padding repeats the lowest)."""
  s = np.random.default_rng(5).permutation(np.arange(N, dtype=np.float32) - 40.0)
  k = _correct(s[None])[0]
  grad = jax.jit(jax.grad(lambda x: jnp.sum(cw.risk_coverage_curve(x, k).thresholds)))(s)
  np.testing.assert_array_equal(np.asarray(grad), np.ones(N, np.float32))


def test_curve_of_concrete_real_scores_with_traced_correctness():
  """Scores known when tracing, correctness traced: the stand-ins are made on the host and the
  thresholds mapped back in the program."""
  s = _scores("logits")
  k = _correct(s)
  got = jax.jit(lambda k: cw.risk_coverage_curve(s, k))(k)
  _assert_same(list(got), list(cw.risk_coverage_curve(s, k)))


# ------------------------------------------------------------------ AUMCC


def ref_aumcc(c, k, thresholds, metric):
  """float64 AUMCC on the coverage axis: ``reference.hard_metrics`` at each threshold in
  float64, the trapezoid over the thresholds that retain something."""
  column = {"selective_accuracy": 1, "cwsa": 2, "cwsa_plus": 3}[metric]
  points = [reference.hard_metrics(c, k, t) for t in np.sort(thresholds)]
  area = 0.0
  for a, b in zip(points[:-1], points[1:]):
    if a[0] > 0 and b[0] > 0:
      area += (a[0] - b[0]) * (a[column] + b[column]) / 2
  return area


GRID = np.array([0.3, 0.5, 0.6, 0.75, 0.9])  # float64 thresholds, not all float32 values


def _clustered(seed):
  """float64 confidences within 1e-10 of the thresholds (both sides, some on them): below
  float32's resolution, so float32 would move them across."""
  rng = np.random.default_rng(seed)
  c = rng.choice(GRID, N) + rng.choice([-1e-10, 0.0, 1e-10], N)
  c[::4] = rng.random(N // 4)
  k = rng.random(N) < c
  return c, k


@pytest.mark.parametrize("metric", ["selective_accuracy", "cwsa", "cwsa_plus"])
def test_aumcc_compares_float64_inputs_in_float64(metric):
  c, k = _clustered(7)
  want = ref_aumcc(c, k, GRID, metric)
  # Teeth: float32-rounded inputs have another curve.
  rounded = ref_aumcc(c.astype(np.float32).astype(np.float64), k,
                      GRID.astype(np.float32).astype(np.float64), metric)
  assert abs(rounded - want) > 1e-4
  got = cw.aumcc(c, k, GRID, metric=metric)
  assert float(got) == pytest.approx(want, rel=1e-6, abs=1e-7)
  assert float(cw.aumcc(c, k, list(GRID), metric=metric)) == float(got)  # Python floats
  with jax.enable_x64(True):  # 64-bit JAX arrays too
    assert float(cw.aumcc(jnp.asarray(c), k, jnp.asarray(GRID), metric=metric)) == float(got)


def test_aumcc_still_refuses_real_valued_scores():
  s = _scores("logits")
  k = _correct(s)
  fn = lambda s, k: cw.aumcc(s, k, GRID.astype(np.float32))  # noqa: E731
  with pytest.raises(ValueError, match="confidences"):
    fn(s, k)
  assert np.all(np.isnan(np.asarray(jax.jit(fn)(jnp.asarray(s), k))))
  unit = _scores("unit")
  np.testing.assert_array_equal(np.asarray(jax.jit(fn)(jnp.asarray(unit), k)),
                                np.asarray(fn(unit, k)))
