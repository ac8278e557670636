"""Every public function with JAX's 64-bit mode on (``jax_enable_x64``), as many research scripts run.

The exact metrics compute in float32 with int32 counts whatever the mode: with
x64 on they must give the same values, bit for bit, as without it on the same
inputs rounded to float32 (eagerly and inside a user's jit). The smooth
functions follow their inputs' dtype: float64 in, float64 out, close to the
float32 result, and their float64 gradients pass ``check_grads``.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import cwsa_jax as cw
from cwsa_jax.streaming import CalibrationState, RiskCoverageState, SweepState

N = 600
T = np.linspace(0.0, 0.95, 11)


def _data():
  rng = np.random.default_rng(7)
  c = rng.uniform(0.0, 1.0, N)
  c[::9] = 0.5  # ties
  k = rng.uniform(size=N) < c
  groups = rng.integers(0, 3, N)
  logits = rng.normal(size=(N, 4))
  labels = rng.integers(0, 4, N)
  return c, k, groups, logits, labels


_KEY = 3  # jax.random.key(_KEY), made inside each call's mode

EXACT = {
    "aurc": lambda c, k, *_: cw.aurc(c, k),
    "aurc_trapezoid": lambda c, k, *_: cw.aurc(c, k, convention="trapezoid"),
    "augrc": lambda c, k, *_: cw.augrc(c, k),
    "eaurc": lambda c, k, *_: cw.eaurc(c, k),
    "summary": lambda c, k, *_: cw.risk_coverage_summary(c, k),
    "curve": lambda c, k, *_: cw.risk_coverage_curve(c, k),
    "risk_at_coverage": lambda c, k, *_: cw.risk_at_coverage(c, k, 0.5),
    "coverage_at_risk": lambda c, k, *_: cw.coverage_at_risk(c, k, 0.2),
    "aumcc": lambda c, k, *_: cw.aumcc(c, k, T),
    "ece": lambda c, k, *_: cw.ece(c, k),
    "ece_mass": lambda c, k, *_: cw.ece(c, k, binning="mass"),
    "calibration_bins": lambda c, k, *_: cw.calibration_bins(c, k),
    "sweep": lambda c, k, *_: cw.sweep(c, k, T),
    "sweep_graded": lambda c, k, *_: cw.sweep(c, jnp.where(k, 0.75, 0.25), T),
    "cwsa": lambda c, k, *_: cw.cwsa(c, k, 0.5),
    "cwsa_plus": lambda c, k, *_: cw.cwsa_plus(c, k, 0.5),
    "coverage": lambda c, k, *_: cw.coverage(c, 0.5),
    "selective_accuracy": lambda c, k, *_: cw.selective_accuracy(c, k, 0.5),
    "sweep_by_group": lambda c, k, g, *_: cw.sweep_by_group(c, k, g, T, num_groups=3),
    "group_gap": lambda c, k, g, *_: cw.group_gap(cw.sweep_by_group(c, k, g, T, num_groups=3)),
    "contributions": lambda c, k, *_: cw.contributions(c, k, 0.5),
    "bootstrap_ci_aurc": lambda c, k, *_: cw.bootstrap_ci(
        cw.aurc, c, k, key=jax.random.key(_KEY), num_resamples=30),
    "bootstrap_samples_ece": lambda c, k, *_: cw.bootstrap_samples(
        cw.ece, c, k, key=jax.random.key(_KEY), num_resamples=30),
    "bootstrap_sweep": lambda c, k, *_: cw.bootstrap_sweep(
        c, k, T, key=jax.random.key(_KEY), num_resamples=30),
    "paired_bootstrap": lambda c, k, *_: cw.paired_bootstrap(
        cw.aurc, c, k, c * 0.9, k, key=jax.random.key(_KEY), num_resamples=30),
    "sweep_state": lambda c, k, *_: SweepState.from_batch(c, k, T).compute(),
    "calibration_state": lambda c, k, *_: CalibrationState.from_batch(c, k).compute(),
    "risk_coverage_state": lambda c, k, *_: RiskCoverageState.from_batch(c, k).compute(),
}
# Also run inside a user's jit (the bootstraps and states, compiled twice more, only eagerly).
JITTED = {name for name in EXACT if not name.startswith(("bootstrap", "paired")) and
          not name.endswith("_state")}
# Host-only (they return Python values): eager only.
EAGER_ONLY = {
    # A float32 grid: with float64 confidences and a float64 grid the reported threshold is the
    # float64 grid value (tests/test_float64_classwise_select.py), by design not x64-invariant.
    "select_threshold": lambda c, k, *_: cw.select_threshold(c, k, thresholds=T.astype(np.float32)),
    "most_damaging": lambda c, k, *_: cw.most_damaging(cw.contributions(c, k, 0.5)),
}
SMOOTH = {
    "soft_cwsa": lambda c, k, *_: cw.soft_cwsa(c, k),
    "soft_cwsa_plus": lambda c, k, *_: cw.soft_cwsa_plus(c, k),
    "soft_cwsa_sweep": lambda c, k, *_: cw.soft_cwsa_sweep(c, k, T),
    "soft_cwsa_band_area": lambda c, k, *_: cw.soft_cwsa_band_area(c, k),
    "nll": lambda c, k, g, z, y: cw.nll(z, y, from_logits=True),
    "brier_score": lambda c, k, g, z, y: cw.brier_score(z, y, from_logits=True),
    "confidences_from_logits": lambda c, k, g, z, y: cw.confidences_from_logits(z, y),
    "confidences_from_probs": lambda c, k, g, z, y: cw.confidences_from_probs(jax.nn.softmax(z), y),
    "confidence_scores": lambda c, k, g, z, y: cw.confidence_scores(z, method="margin"),
    "fit_temperature": lambda c, k, g, z, y: cw.fit_temperature(z, y),
}


def _as_float32(args):
  return [a.astype(np.float32) if a.dtype == np.float64 else a for a in args]


def _leaves(x):
  return [np.asarray(v) for v in jax.tree.leaves(x)]


def _reference(fn, args, *, jit=False):
  """The call without x64, on the inputs rounded to float32 (under ``jax.jit`` if ``jit``: XLA
  fuses a jitted whole differently, and may round the last operations differently)."""
  with jax.enable_x64(False):
    return _leaves((jax.jit(fn) if jit else fn)(*_as_float32(args)))


@pytest.mark.filterwarnings("error::UserWarning")  # e.g. JAX's "float64 is not available"
@pytest.mark.parametrize("name", sorted(EXACT) + sorted(EAGER_ONLY))
def test_exact_metrics_are_the_same_with_x64_on(name):
  fn = {**EXACT, **EAGER_ONLY}[name]
  args = _data()
  refs = {False: _reference(fn, args)}
  with jax.enable_x64(True):
    wide = [jnp.asarray(a) for a in args]  # float64 and int64 arrays
    assert wide[0].dtype == jnp.float64 and wide[2].dtype == jnp.int64
    runs = {("eager float64", False): fn(*wide), ("eager float32", False): fn(*_as_float32(args))}
    if name in JITTED:
      runs[("jit float64", True)] = jax.jit(fn)(*wide)
  if name in JITTED:
    refs[True] = _reference(fn, args, jit=True)
  for (how, jitted), out in runs.items():
    ref = refs[jitted]
    got = _leaves(out)
    assert len(got) == len(ref), how
    for g, r in zip(got, ref):
      assert g.dtype == r.dtype, (how, g.dtype, r.dtype)
      np.testing.assert_array_equal(g, r, err_msg=how)


# Already one compiled program eagerly (and its eager path is the one users call).
SMOOTH_EAGER = {"fit_temperature"}
# Documented as float32 whatever the input (computed from float64 logits, then rounded).
FLOAT32_OUT = {"nll", "brier_score", "confidences_from_logits", "confidences_from_probs"}


@pytest.mark.filterwarnings("error::UserWarning")
@pytest.mark.parametrize("name", sorted(SMOOTH))
def test_smooth_functions_follow_float64_inputs_with_x64_on(name):
  fn = SMOOTH[name]
  args = _data()
  # Both sides under jax.jit: one program per mode instead of one per eager primitive; the
  # traced dtypes are the eager ones, and the tolerance below absorbs fusion rounding.
  jit = name not in SMOOTH_EAGER
  ref = _reference(fn, args, jit=jit)
  with jax.enable_x64(True):
    out = _leaves((jax.jit(fn) if jit else fn)(*[jnp.asarray(a) for a in args]))
  assert len(out) == len(ref)
  for g, r in zip(out, ref):
    if r.dtype == np.float32:
      assert g.dtype == (np.float32 if name in FLOAT32_OUT else np.float64), (g.dtype, r.dtype)
      np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-6)
    else:
      np.testing.assert_array_equal(g, r)


@pytest.mark.parametrize("name", ["soft_cwsa", "soft_cwsa_sweep", "soft_cwsa_band_area"])
def test_soft_metric_float64_gradients_pass_check_grads(name):
  fn = SMOOTH[name]
  c, k, *_ = _data()
  # Away from the clip at 0 and 1, and from the thresholds, where phi has its documented kink.
  c = np.clip(c, 0.02, 0.98)
  kinks = np.concatenate([T, np.linspace(0.5, 0.9, 9)])  # the sweep's and the band's thresholds
  c[np.min(np.abs(c[:, None] - kinks), axis=1) < 1e-3] = 0.6123
  with jax.enable_x64(True):
    c = jnp.asarray(c)
    # Jitted: check_grads evaluates at several points of one shape, so one program each.
    check_grads(jax.jit(lambda x: fn(x, k)), (c,), order=1, modes=("rev",), eps=1e-6, atol=1e-6,
                rtol=1e-4)


def test_exact_metrics_inside_a_user_jit_with_float64_work():
  """A float64 pipeline under a user's jit: the kit's part reads float32, the rest stays float64."""
  c, k, *_ = _data()
  with jax.enable_x64(False):
    ref = float(cw.aurc(c.astype(np.float32), k))

  @jax.jit
  def pipeline(x):
    return jnp.sum(x * 2.0), cw.aurc(x, k)

  with jax.enable_x64(True):
    total, area = pipeline(jnp.asarray(c))
    assert total.dtype == jnp.float64 and area.dtype == jnp.float32
  assert float(area) == ref


def test_exact_metric_gradients_with_x64_on_are_the_float32_ones_in_float64():
  """The custom JVPs of cwsa and the sweep, through the rounding to float32: float64 cotangents
  holding the float32 gradients."""
  c, k, *_ = _data()
  fns = {"cwsa": lambda x: cw.cwsa(x, k, 0.3),
         "sweep": lambda x: jnp.sum(cw.sweep(x, k, T).cwsa_plus)}
  for name, fn in fns.items():
    with jax.enable_x64(False):
      ref = np.asarray(jax.jit(jax.grad(fn))(c.astype(np.float32)))
    with jax.enable_x64(True):
      got = jax.jit(jax.grad(fn))(jnp.asarray(c))
    assert got.dtype == jnp.float64, name
    np.testing.assert_array_equal(np.asarray(got, np.float32), ref, err_msg=name)
    assert np.any(ref != 0), name


@pytest.mark.slow
@pytest.mark.filterwarnings("error::FutureWarning", "error::UserWarning")
def test_cli_evaluate_is_the_same_with_x64_on(tmp_path, capsys):
  """The commands compute in 32 bits whatever JAX_ENABLE_X64 says: same report, no dtype warnings."""
  from cwsa_jax import cli

  c, k, *_ = _data()
  path = tmp_path / "p.csv"
  path.write_text("confidence,correct\n" + "".join(f"{float(a)!r},{int(b)}\n" for a, b in zip(c, k)))
  reports = {}
  for x64 in (False, True):
    out = tmp_path / f"out{int(x64)}"
    with jax.enable_x64(x64):
      code = cli.main(["evaluate", str(path), "--out", str(out), "--bootstrap", "200",
                       "--no-figures", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    reports[x64] = json.loads((out / "metrics.json").read_text())
  for field in ("n", "accuracy", "ece", "aurc", "eaurc", "augrc", "aumcc", "sweep",
                "threshold_choice", "intervals"):
    assert reports[True][field] == reports[False][field], field
