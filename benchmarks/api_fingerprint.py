"""Fingerprint of the public API: signatures and bit-exact outputs, to check a refactor changed nothing.

Records the signature of every public name of ``cwsa_jax``, ``cwsa_jax.streaming``,
``cwsa_jax.losses`` (and ``cwsa_jax.nnx`` when flax is installed; classes: their
fields and public methods), then calls every public function on fixed inputs
(numpy ``default_rng(0)``), eagerly (every variant) and under ``jax.jit`` (the first
variant of each function: compiling dominates the run time), builds / merges /
computes the streaming states, and vmaps ``sweep`` and ``ece`` over 3 models.
Each result is flattened with ``jax.tree_util``; every leaf is recorded as
dtype, shape, sha256 of its bytes and its first values (for human eyes).
A host-only function whose ``jit`` fails is recorded as "not jittable: <error>".

  python benchmarks/api_fingerprint.py --out /tmp/fp_after.json     # same, before: --out /tmp/fp_before.json
  python benchmarks/api_fingerprint.py --compare /tmp/fp_before.json /tmp/fp_after.json

``--compare`` prints every entry that differs and exits 1, else prints
"identical: N entries" and exits 0. Without ``--out`` the JSON goes to stdout.
``cwsa_jax`` is imported from wherever Python finds it (stderr names the file):
for another checkout, e.g. a ``git worktree`` of the commit before, run with
``PYTHONPATH=<that checkout>`` (else the editable install's copy is imported).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import hashlib
import inspect
import json
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np

import cwsa_jax as cj
from cwsa_jax import losses
from cwsa_jax import streaming as st


def public_names(mod) -> list[str]:
  if hasattr(mod, "__all__"):
    return list(mod.__all__)
  return sorted(n for n, o in vars(mod).items()
                if not n.startswith("_") and callable(o) and getattr(o, "__module__", None) == mod.__name__)


def signature(obj) -> str:
  if inspect.isclass(obj):
    if hasattr(obj, "_fields"):
      fields = list(obj._fields)
    elif dataclasses.is_dataclass(obj):
      fields = [f.name for f in dataclasses.fields(obj)]
    else:  # a plain class (nnx metrics): its constructor
      fields = [f"__init__{inspect.signature(obj.__init__)}"]
    methods = [f"{name}: property" if isinstance(attr, property) else f"{name}{inspect.signature(getattr(obj, name))}"
               for name, attr in sorted(vars(obj).items()) if not name.startswith("_")
               and isinstance(attr, (property, types.FunctionType, classmethod, staticmethod))]
    return f"class fields={fields} methods={methods}"
  return str(inspect.signature(obj)) if callable(obj) else f"<not callable: {type(obj).__name__}>"


def fingerprint(result) -> dict:
  leaves, treedef = jax.tree_util.tree_flatten(result)
  arrays = [np.ascontiguousarray(np.asarray(leaf)) for leaf in leaves]
  return {"treedef": str(treedef), "leaves": [
      {"dtype": str(a.dtype), "shape": list(a.shape), "sha256": hashlib.sha256(a.tobytes()).hexdigest(),
       "head": [float(v) for v in a.ravel()[:4]]} for a in arrays]}


def make_inputs():
  rng = np.random.default_rng(0)
  n, k = 1000, 10
  c = rng.random(n).astype(np.float32)
  c[:300] = np.round(c[:300], 2)                      # ties
  c[300:306] = [0.0, 1.0, 0.5, 0.0, 1.0, 0.5]          # exact edge values
  ok = rng.random(n) < c                               # roughly calibrated correctness
  logits = (rng.normal(size=(n, k)) * 2.0).astype(np.float32)
  z = logits - logits.max(-1, keepdims=True)
  probs = (np.exp(z) / np.exp(z).sum(-1, keepdims=True)).astype(np.float32)
  labels = rng.integers(0, k, n).astype(np.int32)
  groups = rng.integers(0, 3, n).astype(np.int32)
  c3 = np.round(rng.random((3, n)), 3).astype(np.float32)
  ok3 = rng.random((3, n)) < c3
  return dict(c=jnp.asarray(c), ok=jnp.asarray(ok), logits=jnp.asarray(logits), probs=jnp.asarray(probs),
              labels=jnp.asarray(labels), groups=jnp.asarray(groups), c3=jnp.asarray(c3),
              ok3=jnp.asarray(ok3), t=jnp.linspace(0.5, 0.95, 10), kappa=jnp.asarray(c * ok, jnp.float32))


def cases(x):
  """(label, f, args): f(*args) is called eagerly and as jax.jit(f)(*args)."""
  c, ok, t, lg, lb, pr = x["c"], x["ok"], x["t"], x["logits"], x["labels"], x["probs"]
  key, B, P = jax.random.key(0), 50, functools.partial
  yield "inputs", lambda *a: a, tuple(x[k] for k in sorted(x))
  for m in ("msp", "max_logit", "margin", "logit_margin", "neg_entropy", "doctor"):
    yield f"confidence_scores[{m}]", P(cj.confidence_scores, method=m), (lg,)
  yield "confidences_from_logits", cj.confidences_from_logits, (lg, lb)
  yield "confidences_from_probs", cj.confidences_from_probs, (pr, lb)
  for fl in (False, True):
    yield f"brier_score[from_logits={fl}]", P(cj.brier_score, from_logits=fl), (lg if fl else pr, lb)
    yield f"nll[from_logits={fl}]", P(cj.nll, from_logits=fl), (lg if fl else pr, lb)
  yield "fit_temperature", cj.fit_temperature, (lg, lb)
  for tau in (0.5, 0.8):
    yield f"coverage[tau={tau}]", P(cj.coverage, tau=tau), (c,)
    yield f"cwsa_plus[tau={tau}]", P(cj.cwsa_plus, tau=tau), (c, ok)
    yield f"selective_accuracy[tau={tau}]", P(cj.selective_accuracy, tau=tau), (c, ok)
    for norm in ("retained", "all"):
      yield f"cwsa[tau={tau},normalize={norm}]", P(cj.cwsa, tau=tau, normalize=norm), (c, ok)
    for metric in ("cwsa", "cwsa_plus"):
      yield f"contributions[tau={tau},metric={metric}]", P(cj.contributions, tau=tau, metric=metric), (c, ok)
      yield (f"most_damaging[tau={tau},metric={metric}]",
             lambda c, k, tau=tau, m=metric: cj.most_damaging(cj.contributions(c, k, tau, metric=m), k=10), (c, ok))
  for norm in ("retained", "all"):
    yield f"sweep[normalize={norm}]", P(cj.sweep, normalize=norm), (c, ok, t)
    yield (f"sweep_by_group[normalize={norm}]", P(cj.sweep_by_group, num_groups=3, normalize=norm),
           (c, ok, x["groups"], t))
  yield "sweep[graded]", cj.sweep, (c, x["kappa"], t)
  for field in ("cwsa", "cwsa_plus", "selective_accuracy", "coverage"):
    yield (f"group_gap[field={field}]", lambda c, k, g, t, f=field: cj.group_gap(
        cj.sweep_by_group(c, k, g, t, num_groups=3), f), (c, ok, x["groups"], t))
  for conv in ("step", "trapezoid", "published_code"):
    for name in ("aurc", "augrc", "eaurc", "risk_coverage_summary"):
      yield f"{name}[convention={conv}]", P(getattr(cj, name), convention=conv), (c, ok)
  yield "risk_coverage_curve", cj.risk_coverage_curve, (c, ok)
  yield "risk_at_coverage", cj.risk_at_coverage, (c, ok, jnp.array([0.1, 0.3, 0.5, 0.9, 1.0]))
  yield "coverage_at_risk", cj.coverage_at_risk, (c, ok, jnp.array([0.0, 0.1, 0.25, 0.5, 1.0]))
  for metric, axis in (("cwsa", "coverage"), ("cwsa_plus", "threshold"), ("selective_accuracy", "coverage")):
    yield f"aumcc[metric={metric},axis={axis}]", P(cj.aumcc, metric=metric, axis=axis), (c, ok, t)
  yield "aumcc[normalize=all]", P(cj.aumcc, normalize="all"), (c, ok, t)
  for binning in ("width", "mass"):
    yield f"calibration_bins[binning={binning}]", P(cj.calibration_bins, binning=binning), (c, ok)
    for norm in ("l1", "l2", "max"):
      yield f"ece[norm={norm},binning={binning}]", P(cj.ece, norm=norm, binning=binning), (c, ok)
  yield "ece[num_bins=10,graded]", P(cj.ece, num_bins=10), (c, x["kappa"])
  yield "soft_cwsa", P(cj.soft_cwsa, tau=0.6, temperature=0.02), (c, ok)
  yield "soft_cwsa[normalize=all]", P(cj.soft_cwsa, normalize="all"), (c, ok)
  yield "soft_cwsa_plus", P(cj.soft_cwsa_plus, tau=0.6, temperature=0.02), (c, ok)
  for plus in (False, True):
    yield f"soft_cwsa_sweep[plus={plus}]", P(cj.soft_cwsa_sweep, plus=plus), (c, ok, t)
    yield f"soft_cwsa_band_area[plus={plus}]", P(cj.soft_cwsa_band_area, plus=plus), (c, ok)
  yield "soft_cwsa_band_area[area]", P(cj.soft_cwsa_band_area, band=(0.3, 0.8), average=False), (c, ok)
  yield "default_thresholds", cj.default_thresholds, ()
  yield "published_thresholds", cj.published_thresholds, ()
  for metric in ("cwsa", "cwsa_plus", "selective_accuracy"):
    for kw in ({}, {"min_coverage": 0.5}, {"max_risk": 0.3}, {"thresholds": t}):
      label = "".join(f",{k}={'grid' if k == 'thresholds' else v}" for k, v in kw.items())
      yield f"select_threshold[metric={metric}{label}]", P(cj.select_threshold, metric=metric, **kw), (c, ok)
  metrics = {"cwsa": lambda c, k: cj.cwsa(c, k, 0.7), "ece": cj.ece, "aurc": cj.aurc,
             "sweep_partial": P(cj.sweep, thresholds=t), "lambda_aurc": lambda c, k: cj.aurc(c, k) + 0.0}
  for name, fn in metrics.items():  # each of bootstrap_ci's paths: bucketed, sorted once, generic
    yield f"bootstrap_ci[{name}]", lambda c, k, fn=fn: cj.bootstrap_ci(fn, c, k, key=key, num_resamples=B), (c, ok)
  yield "bootstrap_samples[aurc]", lambda c, k: cj.bootstrap_samples(cj.aurc, c, k, key=key, num_resamples=B), (c, ok)
  for name in ("cwsa", "ece"):
    yield (f"paired_bootstrap[{name}]", lambda a, ka, b, kb, fn=metrics[name]: cj.paired_bootstrap(
        fn, a, ka, b, kb, key=key, num_resamples=B), (c, ok, x["c3"][0], x["ok3"][0]))
  yield ("bootstrap_ci[chunk_size=7]", lambda c, k: cj.bootstrap_ci(
      cj.ece, c, k, key=key, num_resamples=B, chunk_size=7), (c, ok))
  yield "bootstrap_sweep", lambda c, k, t: cj.bootstrap_sweep(c, k, t, key=key, num_resamples=B), (c, ok, t)
  yield ("bootstrap_sweep[graded]", lambda c, k, t: cj.bootstrap_sweep(
      c, k, t, key=key, num_resamples=B), (c, x["kappa"], t))
  for name in public_names(losses):  # every option of the losses module
    fn, options = getattr(losses, name), [{"correctness": "probability"}, {"correctness": "hard"}]
    if name.startswith("cwsa_"):
      options.append({"band": (0.5, 0.9), "plus": True, "tau": 0.7})
    for kw in [{"gamma": 2.0}] if "focal" in name else options:
      yield f"losses.{name}[{','.join(f'{k}={v}' for k, v in kw.items())}]", P(fn, **kw), (lg, lb)
  yield "losses.cwsa_surrogate_loss[grad]", jax.grad(losses.cwsa_surrogate_loss), (lg, lb)
  yield "vmap.sweep[3 models]", jax.vmap(lambda c, k: cj.sweep(c, k, t)), (x["c3"], x["ok3"])
  yield "vmap.ece[3 models]", jax.vmap(cj.ece), (x["c3"], x["ok3"])
  yield from streaming_cases(x)


def streaming_cases(x):
  c, ok, t = x["c"], x["ok"], x["t"]
  def merged(cls, c, k, *t):  # empty() merged with the states of two uneven batches
    parts = [cls.from_batch(c[i:j], k[i:j], *t) for i, j in ((0, 600), (600, None))]
    return functools.reduce(cls.merge, parts, cls.empty(*t))
  yield ("streaming.SweepState", lambda c, k, t: [s := merged(st.SweepState, c, k, t), s.compute(),
                                                  s.compute(normalize="all")], (c, ok, t))
  yield ("streaming.SweepState[reduce,mask]", lambda c, k, t: st.SweepState.from_batch(
      c.reshape(4, 250), k.reshape(4, 250), t, mask=(c > 0.05).reshape(4, 250)).reduce().compute(), (c, ok, t))
  configured = st.SweepState.configure(thresholds=t, normalize="all")  # host-side: outside the jit
  yield ("streaming.SweepState[configure,model_output]", lambda lg, lb: configured.from_model_output(
      logits=lg, labels=lb).compute(), (x["logits"], x["labels"]))
  yield ("streaming.CalibrationState", lambda c, k: [s := merged(st.CalibrationState, c, k), s.bins()] + [
      s.compute(norm=norm) for norm in ("l1", "l2", "max")], (c, ok))
  yield "streaming.RiskCoverageState", lambda c, k: [s := merged(st.RiskCoverageState, c, k), s.compute()], (c, ok)
  batches = lambda c, k: [(c[i:i + 300], k[i:i + 300]) for i in range(0, 1000, 300)]  # ragged last batch
  yield "streaming.evaluate_batches", lambda c, k, t: st.evaluate_batches(batches(c, k), t, progress=False), (c, ok, t)
  yield ("streaming.process_merge", lambda c, k, t: [st.process_merge(s).compute() for s in (
      st.SweepState.from_batch(c, k, t), st.CalibrationState.from_batch(c, k))], (c, ok, t))
  try:
    from cwsa_jax import nnx
  except ModuleNotFoundError:
    return
  def nnx_metrics(c, k):  # stateful Python objects: nnx.jit, not jax.jit, is their compiled form
    metrics = (nnx.SweepMetric(np.asarray(t)), nnx.CalibrationMetric(norm="l2"), nnx.RiskCoverageMetric())
    for m in metrics:
      m.update(confidences=c[:600], correct=k[:600], loss=0.0)
      m.update(confidences=c[600:], correct=k[600:])
    return [m.compute() for m in metrics]
  yield "nnx.metrics", nnx_metrics, (c, ok)


def collect() -> dict:
  entries = {"meta:jax": jax.__version__, "meta:numpy": np.__version__, "meta:backend": jax.default_backend()}
  modules = [cj, st, losses]
  try:
    from cwsa_jax import nnx
    modules.append(nnx)
  except ModuleNotFoundError:
    entries["meta:nnx"] = "flax not installed: cwsa_jax.nnx skipped"
  for mod in modules:
    for name in public_names(mod):
      entries[f"sig:{mod.__name__}.{name}"] = signature(getattr(mod, name))
  jitted = set()
  for label, f, args in cases(make_inputs()):
    try:
      entries[f"call:{label}"] = fingerprint(f(*args))
    except Exception as err:  # recorded, so that a call a refactor breaks shows up in --compare
      entries[f"call:{label}"] = f"error: {type(err).__name__}: {err}"
    base = label.split("[")[0]
    if base in jitted:  # jit the first variant of each function only: compiling dominates the time
      continue
    jitted.add(base)
    try:
      entries[f"jit:{label}"] = fingerprint(jax.jit(f)(*args))
    except Exception as err:
      entries[f"jit:{label}"] = f"not jittable: {type(err).__name__}"
  called = {key.split(":")[1].split("[")[0] for key in entries if key.startswith("call:")}
  entries["meta:not_called"] = sorted(n for n in cj.__all__ if not inspect.isclass(getattr(cj, n)) and n not in called)
  return entries


def describe(a, b) -> list[str]:
  """What differs between two entries: for call results, the tree structure and each leaf that changed."""
  dump = lambda v: json.dumps(v, sort_keys=True)  # NaN-safe equality of the 'head' lists
  if not (isinstance(a, dict) and isinstance(b, dict)):
    return [f"A: {dump(a)}", f"B: {dump(b)}"]
  out = [] if a["treedef"] == b["treedef"] else [f"treedef A: {a['treedef']}", f"treedef B: {b['treedef']}"]
  for name, mine, other in (("A", a, b), ("B", b, a)):  # leaves matched as multisets: an inserted leaf shows alone
    extra = collections.Counter(map(dump, mine["leaves"])) - collections.Counter(map(dump, other["leaves"]))
    for i, leaf in enumerate(mine["leaves"]):
      if extra[dump(leaf)] > 0:
        extra[dump(leaf)] -= 1
        out.append(f"leaf {i} only in {name}: {leaf['dtype']}{leaf['shape']} {leaf['sha256'][:12]} head={leaf['head']}")
  return out or ["the same leaves in another order"]


def compare(path_a: str, path_b: str) -> int:
  with open(path_a) as fa, open(path_b) as fb:
    a, b = json.load(fa), json.load(fb)
  keys = sorted(a.keys() | b.keys())
  diff = [k for k in keys if json.dumps(a.get(k), sort_keys=True) != json.dumps(b.get(k), sort_keys=True)]
  for k in diff:
    print(f"DIFF {k}" + "".join(f"\n  {line}" for line in describe(a.get(k, "<missing>"), b.get(k, "<missing>"))))
  if diff:
    print(f"{len(diff)} of {len(keys)} entries differ")
    return 1
  print(f"identical: {len(keys)} entries")
  return 0


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", help="write the JSON here instead of stdout")
  parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two fingerprint files")
  opts = parser.parse_args()
  if opts.compare:
    return compare(*opts.compare)
  print(f"fingerprinting {cj.__file__}", file=sys.stderr)
  text = json.dumps(collect(), sort_keys=True, indent=1)
  with open(opts.out, "w") if opts.out else contextlib.nullcontext(sys.stdout) as f:
    f.write(text + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
