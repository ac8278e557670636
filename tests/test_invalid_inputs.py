"""Invalid values: an error on concrete inputs, NaN (never a plausible number) inside jit and vmap.

One table, every public metric x every invalid class it can receive x {eager, jit, vmap}:

* eager (concrete arrays): ``ValueError`` naming the offending argument;
* ``jax.jit``: the result is NaN;
* ``jax.vmap`` over a batch of [valid, invalid]: the invalid row is NaN, the valid row
  equals the eager result.

XLA compilation dominates this file's time, so each function's whole table is one program:
one ``jax.jit`` holding, for each group of classes with the same input dtypes, the
unbatched function over the classes' inputs (``lax.map``: the body is traced unbatched,
as under a plain ``jax.jit``) and its ``jax.vmap`` over the same batch.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import checkify

import cwsa_jax as cw
from cwsa_jax._kernels import _dispatch
from cwsa_jax import _validation
from cwsa_jax import losses
from cwsa_jax import streaming

KEY = jax.random.key(0)
N = 8
K = 3
BAD = 2  # the sample (or row) an invalid class corrupts


def _probs() -> np.ndarray:
  rng = np.random.default_rng(0)
  p = rng.dirichlet(np.ones(K), size=N)
  return (p / p.sum(-1, keepdims=True)).astype(np.float32)


BASE = dict(
    c=np.array([0.95, 0.9, 0.8, 0.75, 0.7, 0.62, 0.55, 0.3], np.float32),
    k=np.array([1, 1, 0, 1, 1, 0, 1, 0], np.int32),
    tau=np.float32(0.6),
    t=np.array([0.5, 0.7], np.float32),
    temp=np.float32(0.05),
    cov=np.float32(0.5),
    risk=np.float32(0.25),
    groups=np.array([0, 1, 0, 1, 0, 1, 0, 1], np.int32),
    probs=_probs(),
    labels=np.array([0, 1, 2, 0, 1, 2, 0, 1], np.int32),
    logits=np.log(_probs()),
    weight=np.float32(0.5),
    gamma=np.float32(2.0),
)
KEYS = tuple(BASE)


# --------------------------------------------------------------------------- invalid classes


class Invalid(NamedTuple):
  key: str                       # which input it corrupts
  corrupt: Callable[[np.ndarray], np.ndarray]
  match: str                     # the eager ValueError names this


def _at(value, dtype=None):
  def corrupt(x):
    x = np.array(x, dtype=dtype or x.dtype)
    x[BAD] = value
    return x
  return corrupt


def _const(value):
  return lambda x: np.full_like(x, value)


def _row(values):
  def corrupt(x):
    x = np.array(x)
    x[BAD] = values
    return x
  return corrupt


CLASSES = {
    "confidence_nan": Invalid("c", _at(np.nan), "confidences"),
    "confidence_inf": Invalid("c", _at(np.inf), "confidences"),
    "confidence_above_1": Invalid("c", _at(1.5), "confidences"),
    "confidence_below_0": Invalid("c", _at(-0.1), "confidences"),
    "correct_integer_2": Invalid("k", _at(2), "correct"),
    "correct_graded_above_1": Invalid("k", _at(1.5, np.float32), "correct"),
    "correct_graded_nan": Invalid("k", _at(np.nan, np.float32), "correct"),
    "tau_nan": Invalid("tau", _const(np.nan), "tau"),
    "tau_inf": Invalid("tau", _const(np.inf), "tau"),
    "tau_1": Invalid("tau", _const(1.0), "tau"),
    "tau_negative": Invalid("tau", _const(-0.1), "tau"),
    "thresholds_nan": Invalid("t", _const(np.nan), "thresholds"),
    "thresholds_1": Invalid("t", _const(1.0), "thresholds"),
    "thresholds_negative": Invalid("t", _const(-0.5), "thresholds"),
    "temperature_0": Invalid("temp", _const(0.0), "temperature"),
    "temperature_negative": Invalid("temp", _const(-0.05), "temperature"),
    "temperature_nan": Invalid("temp", _const(np.nan), "temperature"),
    "temperature_inf": Invalid("temp", _const(np.inf), "temperature"),
    "coverage_target_0": Invalid("cov", _const(0.0), "coverage"),
    "coverage_target_above_1": Invalid("cov", _const(1.5), "coverage"),
    "coverage_target_nan": Invalid("cov", _const(np.nan), "coverage"),
    "risk_target_negative": Invalid("risk", _const(-0.1), "risk"),
    "risk_target_nan": Invalid("risk", _const(np.nan), "risk"),
    "groups_out_of_range": Invalid("groups", _at(2), "groups"),
    "groups_negative": Invalid("groups", _at(-1), "groups"),
    "probs_sum_0.8": Invalid("probs", lambda p: _row(p[BAD] * 0.8)(p), "probs"),
    "probs_outside_0_1": Invalid("probs", _row([1.5, -0.5, 0.0]), "probs"),
    "probs_nan": Invalid("probs", _row([np.nan, 0.5, 0.5]), "probs"),
    "labels_K": Invalid("labels", _at(K), "labels"),
    "labels_negative": Invalid("labels", _at(-1), "labels"),
    "logits_nan": Invalid("logits", _row([np.nan, 0.0, 0.0]), "logits|probs"),
    "logits_inf": Invalid("logits", _row([np.inf, 0.0, 0.0]), "logits|probs"),
    "weight_negative": Invalid("weight", _const(-1.0), "weight"),
    "weight_nan": Invalid("weight", _const(np.nan), "weight"),
    "gamma_negative": Invalid("gamma", _const(-1.0), "gamma"),
    "gamma_inf": Invalid("gamma", _const(np.inf), "gamma"),
}

CONFIDENCE = ["confidence_nan", "confidence_inf", "confidence_above_1", "confidence_below_0"]
CORRECT = ["correct_integer_2", "correct_graded_above_1", "correct_graded_nan"]
SAMPLES = CONFIDENCE + CORRECT
TAU = ["tau_nan", "tau_inf", "tau_1", "tau_negative"]
THRESHOLDS = ["thresholds_nan", "thresholds_1", "thresholds_negative"]
TEMPERATURE = ["temperature_0", "temperature_negative", "temperature_nan", "temperature_inf"]
GROUPS = ["groups_out_of_range", "groups_negative"]
PROBS = ["probs_sum_0.8", "probs_outside_0_1", "probs_nan"]
LABELS = ["labels_K", "labels_negative"]
LOGITS = ["logits_nan", "logits_inf"]
WEIGHT = ["weight_negative", "weight_nan"]
GAMMA = ["gamma_negative", "gamma_inf"]


# --------------------------------------------------------------------------- public functions


def _stack(result) -> jax.Array:
  """The floating leaves of a result, flattened into one vector per batch row."""
  leaves = [x for x in jax.tree_util.tree_leaves(result)
            if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)]
  return jnp.concatenate([jnp.reshape(x, x.shape[:0] + (-1,)) for x in leaves])


def _sweep_fields(r) -> jax.Array:
  return _stack((r.coverage, r.selective_accuracy, r.cwsa, r.cwsa_plus))


def _drop_estimate_b(r):
  return (r.estimate_a, r.difference, r.low, r.high, r.p_value)


# Module-level metrics for the bootstrap: one static function, so one compilation.
def _cwsa_06(c, k):
  return cw.cwsa(c, k, 0.6)


def _aurc(c, k):
  return cw.aurc(c, k)


def _ece(c, k):
  return cw.ece(c, k)


# name -> (function of the inputs dict, its invalid classes, per_sample): per_sample outputs
# are NaN only at the corrupted sample; every other output is NaN as a whole.
FUNCTIONS = {
    "cwsa": (lambda a: cw.cwsa(a["c"], a["k"], a["tau"]), SAMPLES + TAU),
    "cwsa_plus": (lambda a: cw.cwsa_plus(a["c"], a["k"], a["tau"]), SAMPLES + TAU),
    "coverage": (lambda a: cw.coverage(a["c"], a["tau"]), CONFIDENCE + TAU),
    "selective_accuracy": (lambda a: cw.selective_accuracy(a["c"], a["k"], a["tau"]),
                           SAMPLES + TAU),
    "sweep": (lambda a: _sweep_fields(cw.sweep(a["c"], a["k"], a["t"])), SAMPLES + THRESHOLDS),
    "sweep_by_group": (lambda a: _sweep_fields(cw.sweep_by_group(
        a["c"], a["k"], a["groups"], a["t"], num_groups=2)), SAMPLES + THRESHOLDS + GROUPS),
    "group_gap": (lambda a: cw.group_gap(cw.sweep_by_group(
        a["c"], a["k"], a["groups"], a["t"], num_groups=2)), SAMPLES + THRESHOLDS + GROUPS),
    "aumcc": (lambda a: cw.aumcc(a["c"], a["k"], a["t"]), SAMPLES + THRESHOLDS),
    "contributions": (lambda a: cw.contributions(a["c"], a["k"], a["tau"]).terms, SAMPLES + TAU),
    "ece": (lambda a: cw.ece(a["c"], a["k"]), SAMPLES),
    "calibration_bins": (lambda a: cw.calibration_bins(a["c"], a["k"], num_bins=2).accuracy,
                         SAMPLES),
    "aurc": (lambda a: cw.aurc(a["c"], a["k"]), SAMPLES),
    "augrc": (lambda a: cw.augrc(a["c"], a["k"], convention="trapezoid"), SAMPLES),
    "eaurc": (lambda a: cw.eaurc(a["c"], a["k"]), SAMPLES),
    "risk_coverage_summary": (lambda a: _stack(cw.risk_coverage_summary(a["c"], a["k"])[:2]),
                              SAMPLES),
    "risk_coverage_curve": (lambda a: _stack(cw.risk_coverage_curve(a["c"], a["k"])), SAMPLES),
    "risk_at_coverage": (lambda a: cw.risk_at_coverage(a["c"], a["k"], a["cov"]),
                         SAMPLES + ["coverage_target_0", "coverage_target_above_1",
                                    "coverage_target_nan"]),
    "coverage_at_risk": (lambda a: cw.coverage_at_risk(a["c"], a["k"], a["risk"]),
                         SAMPLES + ["risk_target_negative", "risk_target_nan"]),
    "soft_cwsa": (lambda a: cw.soft_cwsa(a["c"], a["k"], a["tau"], temperature=a["temp"]),
                  SAMPLES + TAU + TEMPERATURE),
    "soft_cwsa_plus": (lambda a: cw.soft_cwsa_plus(a["c"], a["k"], a["tau"],
                                                   temperature=a["temp"]),
                       SAMPLES + TAU + TEMPERATURE),
    "soft_cwsa_sweep": (lambda a: cw.soft_cwsa_sweep(a["c"], a["k"], a["t"],
                                                     temperature=a["temp"]),
                        SAMPLES + THRESHOLDS + TEMPERATURE),
    "soft_cwsa_band_area": (lambda a: cw.soft_cwsa_band_area(a["c"], a["k"],
                                                             temperature=a["temp"]),
                            SAMPLES + TEMPERATURE),
    "brier_score": (lambda a: cw.brier_score(a["probs"], a["labels"]), PROBS + LABELS),
    "nll": (lambda a: cw.nll(a["probs"], a["labels"]), PROBS + LABELS),
    "brier_score_logits": (lambda a: cw.brier_score(a["logits"], a["labels"], from_logits=True),
                           LOGITS + LABELS),
    "nll_logits": (lambda a: cw.nll(a["logits"], a["labels"], from_logits=True), LOGITS + LABELS),
    "fit_temperature": (lambda a: cw.fit_temperature(a["logits"], a["labels"]), LOGITS + LABELS),
    "bootstrap_ci": (lambda a: _stack(cw.bootstrap_ci(
        _cwsa_06, a["c"], a["k"], key=KEY, num_resamples=4)), SAMPLES),
    "bootstrap_samples": (lambda a: cw.bootstrap_samples(
        _aurc, a["c"], a["k"], key=KEY, num_resamples=4), SAMPLES),
    # estimate_b is model b's value: valid, so left out.
    "paired_bootstrap": (lambda a: _stack(_drop_estimate_b(cw.paired_bootstrap(
        _ece, a["c"], a["k"], BASE["c"], BASE["k"], key=KEY, num_resamples=4))), SAMPLES),
    "bootstrap_sweep": (lambda a: _stack(cw.bootstrap_sweep(
        a["c"], a["k"], a["t"], key=KEY, num_resamples=4).estimate[1:]), SAMPLES + THRESHOLDS),
    "SweepState.compute": (lambda a: _sweep_fields(streaming.SweepState.from_batch(
        a["c"], a["k"], a["t"]).compute()), SAMPLES + THRESHOLDS),
    "CalibrationState.compute": (lambda a: streaming.CalibrationState.from_batch(
        a["c"], a["k"]).compute(), SAMPLES),
    "RiskCoverageState.compute": (lambda a: _stack(streaming.RiskCoverageState.from_batch(
        a["c"], a["k"], mantissa_bits=2).compute()), SAMPLES),
    "losses.cwsa_surrogate_loss": (lambda a: losses.cwsa_surrogate_loss(
        a["logits"], a["labels"], tau=a["tau"], temperature=a["temp"]),
                                   LOGITS + LABELS + TAU + TEMPERATURE),
    "losses.cwsa_regularized_loss": (lambda a: losses.cwsa_regularized_loss(
        a["logits"], a["labels"], weight=a["weight"], tau=a["tau"], temperature=a["temp"]),
                                     LOGITS + LABELS + TAU + TEMPERATURE + WEIGHT),
    "losses.focal_loss": (lambda a: losses.focal_loss(a["logits"], a["labels"], gamma=a["gamma"]),
                          LOGITS + LABELS + GAMMA),
    "losses.inverse_focal_loss": (lambda a: losses.inverse_focal_loss(
        a["logits"], a["labels"], gamma=a["gamma"]), LOGITS + LABELS + GAMMA),
    "losses.soft_aurc_loss": (lambda a: losses.soft_aurc_loss(
        a["logits"], a["labels"], temperature=a["temp"]), LOGITS + LABELS + TEMPERATURE),
    "losses.soft_aurc_regularized_loss": (lambda a: losses.soft_aurc_regularized_loss(
        a["logits"], a["labels"], weight=a["weight"], temperature=a["temp"]),
                                          LOGITS + LABELS + TEMPERATURE + WEIGHT),
}
PER_SAMPLE = {
    "confidences_from_probs": (lambda a: cw.confidences_from_probs(a["probs"], a["labels"])[0],
                               PROBS + LABELS),
    "confidences_from_logits": (lambda a: cw.confidences_from_logits(a["logits"], a["labels"])[0],
                                LOGITS + LABELS),
    "confidence_scores": (lambda a: cw.confidence_scores(a["logits"], method="margin"), LOGITS),
}
ALL = {**FUNCTIONS, **PER_SAMPLE}

CASES = [(name, cls) for name, (_, classes) in ALL.items() for cls in classes]
# The rank metrics take real-valued scores (only their order counts), eagerly and inside jit:
# these cases are valid for them everywhere.
RANK_METRICS = ("aurc", "augrc", "eaurc", "risk_coverage_summary", "risk_coverage_curve",
                "risk_at_coverage", "coverage_at_risk")
REAL_SCORES = [(name, cls) for name, cls in CASES
               if name in RANK_METRICS and cls in ("confidence_above_1", "confidence_below_0")]
EAGER_CASES = [case for case in CASES if case not in REAL_SCORES]


def _inputs(cls: str | None) -> dict:
  inputs = dict(BASE)
  if cls is not None:
    bad = CLASSES[cls]
    inputs[bad.key] = bad.corrupt(BASE[bad.key])
  return inputs


def _valid_like(cls: str) -> dict:
  """Valid inputs of the same dtypes as the class's (graded classes use float correctness)."""
  inputs = dict(BASE)
  bad = CLASSES[cls]
  inputs[bad.key] = np.asarray(BASE[bad.key], bad.corrupt(BASE[bad.key]).dtype)
  return inputs


def _dtypes(inputs: dict) -> tuple:
  return tuple(np.asarray(inputs[key]).dtype.str for key in KEYS)


class _Traced(NamedTuple):
  """One function's table under jit and vmap, by input-dtype group (see ``_traced``)."""
  mapped: dict     # dtypes -> [rows, ...]: the unbatched function on each row, under jit
  vmapped: dict    # dtypes -> [rows, ...]: jit(vmap(fn)) over the same rows
  eager: dict      # dtypes -> the eager result of row 0 (valid inputs of those dtypes)
  row: dict        # class -> its row in its group


# The functions whose tables share one compiled program (a few programs, not one each).
FAMILY_SIZE = 8
FAMILIES = [tuple(ALL)[i:i + FAMILY_SIZE] for i in range(0, len(ALL), FAMILY_SIZE)]


@functools.lru_cache(maxsize=None)
def _traced_family(names: tuple) -> dict:
  """name -> ``_Traced`` of every function in ``names``, from one compiled program.

  Per function and group of classes with the same input dtypes, the batch is [valid, one
  row per class]; the program returns ``lax.map(fn)`` (each row traced unbatched, exactly
  what ``jax.jit(fn)`` of that row would compute) and ``jax.vmap(fn)`` of the batch.
  """
  batches, tables = {}, {}
  for name in names:
    fn = ALL[name][0]
    groups: dict = {}
    for cls in ALL[name][1]:
      groups.setdefault(_dtypes(_inputs(cls)), []).append(cls)
    batches[name], eager, row = {}, {}, {}
    for dtypes, classes in groups.items():
      rows = [_valid_like(classes[0])] + [_inputs(cls) for cls in classes]
      batches[name][dtypes] = tuple(np.stack([r[key] for r in rows]) for key in KEYS)
      eager[dtypes] = np.asarray(fn(rows[0]))
      row.update({cls: i + 1 for i, cls in enumerate(classes)})
    tables[name] = (eager, row)

  def both(name, batch):
    one = lambda args: ALL[name][0](dict(zip(KEYS, args)))
    return lax.map(one, batch), jax.vmap(lambda *args: one(args))(*batch)

  out = jax.jit(lambda batches: {
      name: {dtypes: both(name, batch) for dtypes, batch in groups.items()}
      for name, groups in batches.items()})(batches)
  out = jax.tree.map(np.asarray, out)
  return {name: _Traced({d: m for d, (m, _) in out[name].items()},
                        {d: v for d, (_, v) in out[name].items()}, *tables[name])
          for name in names}


def _traced(name: str) -> _Traced:
  """``name``'s table under jit and vmap (computed with its family's)."""
  return _traced_family(next(f for f in FAMILIES if name in f))[name]


def _expected_nan(name: str, out: np.ndarray) -> np.ndarray:
  if name in PER_SAMPLE:
    mask = np.zeros(out.shape, bool)
    mask[..., BAD] = True
    return mask
  return np.ones(out.shape, bool)


def _assert_nan_where_expected(name, out):
  out = np.asarray(out)
  expected = _expected_nan(name, out)
  assert np.all(np.isnan(out[expected])), out
  assert not np.any(np.isnan(out[~expected])), out


@pytest.mark.parametrize("name, cls", EAGER_CASES)
def test_eager_raises_value_error_naming_the_problem(name, cls):
  with pytest.raises(ValueError, match=CLASSES[cls].match):
    ALL[name][0](_inputs(cls))


@pytest.mark.parametrize("name, cls", REAL_SCORES)
def test_eager_rank_metrics_take_real_scores(name, cls):
  """Scores outside [0, 1] are accepted eagerly by the rank metrics: the values of the same
  call on the scores' dense ranks mapped into [0, 1] (the curve's thresholds aside)."""
  inputs = _inputs(cls)
  distinct, rank = np.unique(inputs["c"], return_inverse=True)
  ranked = dict(inputs, c=(rank.reshape(-1) / (distinct.size - 1)).astype(np.float32))
  got, want = [ALL[name][0](inputs)], [ALL[name][0](ranked)]
  if name == "risk_coverage_curve":  # the thresholds are the scores' own values
    got, want = (cw.risk_coverage_curve(x["c"], x["k"])[1:] for x in (inputs, ranked))
  for g, w in zip(got, want, strict=True):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@dataclasses.dataclass(frozen=True)
class _OnAccelerator(_dispatch.Kernels):
  """Kernels that treat every concrete array as on an accelerator (``platform="cuda"``) and
  record its answers."""

  platform: str | None = "cuda"
  answers: list = dataclasses.field(default_factory=list, compare=False, repr=False)

  def on_accelerator(self, x):
    self.answers.append(super().on_accelerator(x))
    return self.answers[-1]


def _checked(inputs: dict, key: str, kernels: _dispatch.Kernels):
  """The entry-point checks of ``_validation`` that read the values of input ``key`` (the
  samples; group ids and labels), with these ``kernels``."""
  if key == "groups":
    return _validation.labels(inputs["groups"], 2, "groups", kernels=kernels)
  if key == "labels":
    return _validation.labels(inputs["labels"], K, kernels=kernels)
  return _validation.samples(inputs["c"], inputs["k"], kernels=kernels)


@pytest.mark.parametrize("cls", SAMPLES + GROUPS + LABELS)
def test_accelerator_arrays_are_checked_where_they_live(cls):
  """Arrays on an accelerator are checked by a reduction there (forced here on the CPU arrays):
  the same error, and the same checked values for valid inputs; the reductions there give the
  host's values."""
  key = CLASSES[cls].key
  on_device = _OnAccelerator()
  with pytest.raises(ValueError, match=CLASSES[cls].match):
    _checked(_inputs(cls), key, on_device)
  assert on_device.answers and all(on_device.answers)  # (only _values asks: reduced there)
  valid = _valid_like(cls)
  for a, b in zip(jax.tree.leaves(_checked(valid, key, _OnAccelerator())),
                  jax.tree.leaves(_checked(valid, key, _dispatch.DEFAULT))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  for x in (_inputs(cls)[key], valid[key]):
    binary = not np.issubdtype(np.asarray(x).dtype, np.floating)
    host = _validation._values(x, binary=binary)
    on_device = _OnAccelerator()
    device = _validation._values(x, binary=binary, kernels=on_device)
    assert on_device.answers == [True]  # (only _values asks: reduced there)
    assert device.nonfinite == host.nonfinite and device.not_binary == host.not_binary
    assert (device.low, device.high) == (host.low, host.high)


@pytest.mark.parametrize("name, cls", EAGER_CASES)
def test_under_jit_gives_nan(name, cls):
  traced = _traced(name)
  _assert_nan_where_expected(name, traced.mapped[_dtypes(_inputs(cls))][traced.row[cls]])


@pytest.mark.parametrize("name, cls", EAGER_CASES)
def test_under_vmap_only_the_invalid_row_is_nan(name, cls):
  traced = _traced(name)
  dtypes = _dtypes(_inputs(cls))
  out, eager = traced.vmapped[dtypes], traced.eager[dtypes]
  # The valid row (row 0) is the eager result; the other classes' rows do not leak into it.
  assert np.isfinite(eager).all()
  np.testing.assert_allclose(out[0], eager, rtol=2e-6, atol=1e-7)
  _assert_nan_where_expected(name, out[traced.row[cls]])


@pytest.mark.parametrize("name, cls", REAL_SCORES)
def test_under_jit_and_vmap_rank_metrics_take_real_scores(name, cls):
  """Real-valued scores are valid inside jit and vmap too: the eager call's values."""
  traced = _traced(name)
  dtypes = _dtypes(_inputs(cls))
  want = np.asarray(ALL[name][0](_inputs(cls)))
  assert np.isfinite(want).all()
  for out in (traced.mapped[dtypes], traced.vmapped[dtypes]):
    np.testing.assert_allclose(np.asarray(out[traced.row[cls]]), want, rtol=2e-6, atol=1e-7)


# --------------------------------------------------------------------------- more detail


def test_integer_correctness_stays_integer_until_checked():
  c, tau = jnp.asarray(BASE["c"]), 0.6
  two = jnp.asarray(BASE["k"]).at[0].set(2)
  functions = (lambda k: cw.cwsa(c, k, tau), lambda k: cw.sweep(c, k, BASE["t"]).cwsa,
               lambda k: cw.ece(c, k), lambda k: cw.aurc(c, k))
  jitted = jax.jit(lambda k: [fn(k) for fn in functions])  # one program for all four
  for i, (fn, bad, good) in enumerate(zip(functions, jitted(two), jitted(jnp.asarray(BASE["k"])),
                                          strict=True)):
    assert np.all(np.isnan(np.asarray(bad))), i
    np.testing.assert_allclose(good, fn(BASE["k"] == 1), rtol=1e-6, err_msg=str(i))


def test_one_invalid_threshold_is_nan_only_in_its_column():
  t = jnp.array([0.5, jnp.nan, 0.7, 1.0, -0.5])
  c, k = BASE["c"], BASE["k"]
  good = np.array([True, False, True, False, False])
  reference = cw.sweep(c, k, np.asarray(t)[good])
  # Every traced call in one program.
  sweep, state, groups, soft, area = jax.jit(lambda c, k, t: (
      cw.sweep(c, k, t), streaming.SweepState.from_batch(c, k, t).compute(),
      cw.sweep_by_group(c, k, BASE["groups"], t, num_groups=2).cwsa, cw.soft_cwsa_sweep(c, k, t),
      cw.aumcc(c, k, t)))(c, k, t)
  for fields in (sweep, state):
    for field in ("coverage", "selective_accuracy", "cwsa", "cwsa_plus"):
      values = np.asarray(getattr(fields, field))
      assert np.all(np.isnan(values[~good]))
      np.testing.assert_array_equal(values[good], getattr(reference, field))
  assert np.all(np.isnan(np.asarray(groups)[:, ~good]))
  assert np.all(np.isfinite(np.asarray(groups)[:, good]))
  soft = np.asarray(soft)
  assert np.all(np.isnan(soft[~good])) and np.all(np.isfinite(soft[good]))
  # The area over a curve cannot drop a point silently: any invalid threshold makes it NaN.
  assert np.isnan(float(area))


def test_explicit_batch_axes_mark_only_the_invalid_row():
  c = np.stack([BASE["c"], BASE["c"]])
  c[1, BAD] = np.nan
  k = np.stack([BASE["k"], BASE["k"]])
  probs = np.stack([BASE["probs"], BASE["probs"]])
  probs[1, BAD] *= 0.8
  labels = np.stack([BASE["labels"], BASE["labels"]])
  functions = (lambda c, k: cw.cwsa(c, k, 0.6), lambda c, k: cw.sweep(c, k, BASE["t"]).cwsa,
               lambda c, k: cw.ece(c, k), lambda c, k: cw.aurc(c, k),
               lambda c, k: cw.risk_at_coverage(c, k, jnp.array([0.5, 1.0])))
  # Every traced call in one program.
  outs, bins, curve, brier = jax.jit(lambda c, k, probs, labels: (
      [fn(c, k) for fn in functions], cw.calibration_bins(c, k, num_bins=2),
      cw.risk_coverage_curve(c, k), cw.brier_score(probs, labels)))(c, k, probs, labels)
  for i, (fn, out) in enumerate(zip(functions, outs, strict=True)):
    out = np.asarray(out)
    np.testing.assert_allclose(out[0], fn(BASE["c"], BASE["k"]), rtol=1e-6, err_msg=str(i))
    assert np.all(np.isnan(out[1])), i
  assert np.all(np.asarray(bins.count)[1] == -1) and np.all(np.asarray(bins.count)[0] >= 0)
  assert np.all(np.isnan(np.asarray(bins.accuracy)[1]))
  assert int(curve.num_points[1]) == -1 and int(curve.num_points[0]) == N
  out = np.asarray(brier)
  assert np.isfinite(out[0]) and np.isnan(out[1])


def test_one_tolerance_for_probability_rows():
  tol = _validation.PROBABILITY_TOLERANCE
  labels = BASE["labels"][:2]
  base = np.array([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]], np.float64)
  functions = (cw.brier_score, cw.nll, lambda p, y: cw.confidences_from_probs(p, y).confidences)
  jitted = jax.jit(lambda p, y: [fn(p, y) for fn in functions])  # one program for all three
  for scale in (1 + tol / 2, 1 - tol / 2):
    for i, (fn, traced) in enumerate(zip(functions, jitted(base * scale, labels), strict=True)):
      assert np.all(np.isfinite(np.asarray(fn(base * scale, labels)))), (i, scale)
      assert np.all(np.isfinite(np.asarray(traced))), (i, scale)
  for scale in (1 + 2 * tol, 1 - 2 * tol):
    for i, (fn, traced) in enumerate(zip(functions, jitted(base * scale, labels), strict=True)):
      with pytest.raises(ValueError, match="sum to 1"):
        fn(base * scale, labels)
      assert np.any(np.isnan(np.asarray(traced))), (i, scale)


def test_wrong_dtypes_raise_type_error():
  with pytest.raises(TypeError, match="confidences"):
    cw.cwsa(np.array([True, False]), np.array([True, False]), 0.5)
  with pytest.raises(TypeError, match="labels"):
    cw.nll(BASE["probs"], BASE["labels"].astype(np.float32) + 0.5 > 1)
  with pytest.raises(TypeError, match="correct"):
    cw.ece(BASE["c"], np.array(["a"] * N))
  # Still a ValueError for callers that catch that.
  with pytest.raises(ValueError, match="confidences"):
    cw.sweep(np.array([True]), np.array([True]), [0.5])


def test_rank_metric_range_rule_is_one_argument():
  """The checked scores must lie in [0, 1] by default; ``unit_scores=False`` accepts any
  finite score (NaN still refused), and the CWSA family's samples (``scores=False``) still
  need [0, 1]. (The public rank metrics take concrete real scores through stand-ins in
  [0, 1]: ``cwsa_jax._order``, inside jit too, with stand-ins made in the program.)"""
  c = BASE["c"] * 10.0 - 3.0  # finite real scores outside [0, 1]
  assert np.isfinite(float(cw.aurc(c, BASE["k"])))
  assert float(jax.jit(cw.aurc)(c, BASE["k"])) == float(cw.aurc(c, BASE["k"]))
  with pytest.raises(ValueError, match="confidences"):
    _validation.samples(c, BASE["k"], scores=True)
  checked = _validation.samples(c, BASE["k"], scores=True, unit_scores=False)
  np.testing.assert_array_equal(np.asarray(checked.confidences), c)  # accepted as they are
  assert checked.invalid is None
  # traced: the flag marks non-finite scores only
  flag = jax.jit(
      lambda c: _validation.samples(c, BASE["k"], scores=True, unit_scores=False).invalid)
  assert not bool(flag(c)) and bool(flag(np.where(np.arange(N) == BAD, np.nan, c)))
  with pytest.raises(ValueError, match="NaN"):
    _validation.samples(np.where(np.arange(N) == BAD, np.nan, c), BASE["k"], scores=True,
                        unit_scores=False)
  with pytest.raises(ValueError, match="confidences"):
    _validation.samples(c, BASE["k"], unit_scores=False)  # the CWSA family still needs [0, 1]
  with pytest.raises(ValueError, match="confidences"):
    cw.cwsa(c, BASE["k"], 0.5)


def test_host_only_functions_refuse_tracers():
  with pytest.raises(TypeError, match="select_threshold"):
    jax.jit(lambda c: cw.select_threshold(c, BASE["k"]).threshold)(BASE["c"])
  with pytest.raises(ValueError, match="confidences"):
    cw.select_threshold(np.where(np.arange(N) == BAD, 1.5, BASE["c"]), BASE["k"])
  r = cw.contributions(BASE["c"], BASE["k"], 0.6)
  with pytest.raises(TypeError, match="most_damaging"):
    jax.jit(lambda terms: cw.most_damaging(cw.Contributions(terms, r.retained)))(r.terms)
  with pytest.raises(ValueError, match="NaN"):
    cw.most_damaging(cw.Contributions(r.terms.at[0].set(jnp.nan), r.retained))


@pytest.mark.parametrize("name, cls", [
    ("cwsa", "correct_integer_2"), ("sweep", "thresholds_nan"), ("ece", "confidence_above_1"),
    ("aurc", "confidence_nan"), ("soft_cwsa", "tau_nan"), ("brier_score", "probs_sum_0.8"),
    ("confidences_from_logits", "labels_K"), ("risk_at_coverage", "coverage_target_0"),
])
def test_checkify_reports_the_problem(name, cls):
  fn = ALL[name][0]
  checked = checkify.checkify(jax.jit(lambda *args: fn(dict(zip(KEYS, args)))),
                              errors=checkify.user_checks)
  error, _ = checked(*(_inputs(cls)[key] for key in KEYS))
  assert error.get() is not None and CLASSES[cls].match.split("|")[0] in error.get()
  error, _ = checked(*(_valid_like(cls)[key] for key in KEYS))
  assert error.get() is None
