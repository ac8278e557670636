"""The kit's ranking and calibration metrics beside their peers: scikit-learn, relplot, torch.

Usage: python benchmarks/bench_peers.py [--quick] [--sizes 1e4,1e5,1e6,1e7] [--repeats 5]
       [--relplot-max-n 1e6] [--out results/benchmarks/peers.json]

For each n, on seeded synthetic predictions (confidences ``c ~ U(0.3, 1)`` in
float32, correct with probability ``c``; the "ties" data rounds them to four
decimals, so at most 7001 distinct scores), each public function against what
a user would otherwise call:

* ``auroc`` against ``sklearn.metrics.roc_auc_score(correct, scores)``;
* ``fpr_at_tpr(tpr=0.95)`` against ``sklearn.metrics.roc_curve`` (the first
  ``fpr`` whose ``tpr`` reaches 0.95) and against one NumPy sort of a packed
  int32 key (confidence bits and error), cumsums and the tie-group ends;
* ``average_precision`` (``positive="correct"`` and ``"error"``) against
  ``sklearn.metrics.average_precision_score``;
* ``smooth_ece`` (automatic bandwidth, and at relplot's bandwidth) against
  ``relplot.smECE`` and ``relplot.smECE_sigma``, up to ``--relplot-max-n``
  (relplot spreads the samples with ``np.add.at`` and convolves its mesh
  directly, O(mesh^2), once per step of its search; above the cap the row
  says it was skipped and why);
* ``classwise_ece`` (K = 10 softmax probabilities, labels drawn from them,
  15 bins) against a vectorized NumPy implementation (the kit's float32 bin
  edges, weighted ``np.bincount`` of class * bins + bin per block of rows);
* torchmetrics' ``binary_auroc`` and ``binary_average_precision`` where torch
  and torchmetrics are installed (the record says "not installed" otherwise).

Every peer is first checked equal to the kit (|kit - peer| at most 1e-6 for
the ranking metrics and classwise ECE, 1e-3 for relplot's smECE: the kit runs
its bandwidth search to the fixed point, relplot stops after ten halvings, so
the difference is reported); then the kit (the public function, eager, its
input checks included) and its peers are timed in interleaved rounds
(``_common.interleaved_times``), min (headline) and median; the kit's first
call at each shape (compilation included) is timed separately. Ratio = kit
min / peer min: below one the kit is faster. Prints a table on stderr and the
JSON record on stdout (``--out``: also written there, atomically).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import time
from typing import Callable, NamedTuple

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_baselines as nb  # noqa: E402
from _common import emit, interleaved_times, load_average, summarize  # noqa: E402

import cwsa_jax as cw  # noqa: E402

RANK_TOL = 1e-6
SMECE_TOL = 1e-3
NUM_CLASSES = 10
NUM_BINS = 15
TPR = 0.95
TPR_SLACK = 2.0**-22  # as the kit: a decimal target such as 0.95 matches a rate of exactly 19/20


# --------------------------------------------------------------------------- data


def binary_data(n: int, seed: int = 0) -> dict:
  """{"distinct": (c, correct), "ties": (c rounded to 4 decimals, correct)}: float32 and bool."""
  rng = np.random.default_rng(seed)
  c = rng.uniform(0.3, 1.0, n).astype(np.float32)
  correct = rng.uniform(size=n) < c
  return {"distinct": (c, correct), "ties": (np.round(c, 4).astype(np.float32), correct)}


def multiclass_data(n: int, seed: int = 1, block: int = 1 << 18):
  """[n, K] float32 softmax probabilities of scaled normal logits and labels drawn from them."""
  rng = np.random.default_rng(seed)
  probs = np.empty((n, NUM_CLASSES), np.float32)
  labels = np.empty(n, np.int32)
  for start in range(0, n, block):
    stop = min(n, start + block)
    logits = rng.normal(size=(stop - start, NUM_CLASSES)).astype(np.float32) * np.float32(2.0)
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    probs[start:stop] = p
    cum = np.cumsum(p, axis=1, dtype=np.float64)
    u = rng.uniform(size=(stop - start, 1)) * cum[:, -1:]
    labels[start:stop] = np.minimum((cum < u).sum(axis=1), NUM_CLASSES - 1)
  return probs, labels


# --------------------------------------------------------------------------- peers


def numpy_fpr_at_tpr(scores: np.ndarray, correct: np.ndarray, tpr: float = TPR) -> float:
  """One np.sort of the packed int32 key (bits << 1 | error, descending), cumsums, tie-group ends."""
  bits_desc, error_desc = nb.sorted_outcomes(scores, correct)
  ends = np.flatnonzero(bits_desc[1:] != bits_desc[:-1])
  ends = np.append(ends, bits_desc.shape[0] - 1)
  fp = np.cumsum(error_desc, dtype=np.int64)[ends]
  tp = ends + 1 - fp
  positives, negatives = tp[-1], fp[-1]
  first = np.argmax(tp / positives >= tpr - TPR_SLACK)
  return float(fp[first] / negatives)


def sklearn_fpr_at_tpr(scores: np.ndarray, correct: np.ndarray, tpr: float = TPR) -> float:
  """``roc_curve`` (every threshold kept), then the first fpr whose tpr reaches ``tpr``."""
  from sklearn.metrics import roc_curve  # noqa: PLC0415
  fpr, tpr_curve, _ = roc_curve(correct, scores, drop_intermediate=False)
  return float(fpr[np.argmax(tpr_curve >= tpr - TPR_SLACK)])


def numpy_classwise_ece(probs: np.ndarray, labels: np.ndarray, num_bins: int = NUM_BINS,
                        block: int = 1 << 14) -> float:
  """Mean over classes of the l1 ECE of each class probability, as ``cwsa_jax.classwise_ece``.

  Per block of rows (the [block, K] intermediates stay in cache): the kit's
  equal-width bin of every probability (``numpy_baselines.width_bins``: its
  float32 edges, the last bin closed) offset by ``class * B``, one weighted
  ``np.bincount`` of the probabilities (float64 sums) and one of the labels'
  own cells; per cell, sum of ``p - 1[y = k]`` = their difference.
  """
  n, k = probs.shape
  cells = k * num_bins
  offsets = np.arange(k, dtype=np.intp) * num_bins
  sum_p = np.zeros(cells)
  hits = np.zeros(cells, np.int64)
  for start in range(0, n, block):
    p = probs[start:start + block]
    index = nb.width_bins(p.reshape(-1), num_bins).reshape(p.shape)
    index += offsets
    sum_p += np.bincount(index.reshape(-1), weights=p.reshape(-1), minlength=cells)
    hits += np.bincount(index[np.arange(p.shape[0]), labels[start:start + block]], minlength=cells)
  return float(np.abs(sum_p - hits).reshape(k, num_bins).sum(axis=1).mean() / n)


def load_torchmetrics():
  """(torch, torchmetrics' functional classification module, versions), or Nones and why not."""
  versions = {}
  try:
    import torch  # noqa: PLC0415
    versions["torch"] = torch.__version__
  except ImportError:
    return None, None, {"torch": "not installed", "torchmetrics": "not installed"}
  try:
    import torchmetrics  # noqa: PLC0415
    from torchmetrics.functional import classification  # noqa: PLC0415
    versions["torchmetrics"] = torchmetrics.__version__
  except ImportError:
    return torch, None, {**versions, "torchmetrics": "not installed"}
  return torch, classification, versions


def version(package: str) -> str:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return "not installed"


# --------------------------------------------------------------------------- cases


class Case(NamedTuple):
  metric: str
  options: dict
  data: str
  n: int
  kit: Callable
  peers: dict  # name -> a callable returning a float
  tol: float
  skipped: dict  # name -> why the peer was not run


def as_float(x) -> float:
  return float(np.asarray(x))


def rank_cases(n: int, data: dict, torch, tm) -> list[Case]:
  from sklearn.metrics import average_precision_score, roc_auc_score  # noqa: PLC0415
  cases = []
  for variant, (s, ok) in data.items():
    sj, okj = jax.device_put(s), jax.device_put(ok)
    ts = tk = None
    if tm is not None:
      ts, tk = torch.from_numpy(s), torch.from_numpy(ok.astype(np.int64))
    err = ~ok
    neg = -s
    peers = {"sklearn.roc_auc_score": lambda s=s, ok=ok: roc_auc_score(ok, s)}
    if tm is not None:
      peers["torchmetrics.binary_auroc"] = lambda ts=ts, tk=tk: tm.binary_auroc(ts, tk)
    cases.append(Case("auroc", {}, variant, n, lambda sj=sj, okj=okj: cw.auroc(sj, okj), peers,
                      RANK_TOL, {}))
    peers = {"sklearn.roc_curve": lambda s=s, ok=ok: sklearn_fpr_at_tpr(s, ok),
             "numpy_packed_sort": lambda s=s, ok=ok: numpy_fpr_at_tpr(s, ok)}
    cases.append(Case("fpr_at_tpr", {"tpr": TPR}, variant, n,
                      lambda sj=sj, okj=okj: cw.fpr_at_tpr(sj, okj, TPR), peers, RANK_TOL, {}))
    for positive in ("correct", "error"):
      if positive == "correct":
        peers = {"sklearn.average_precision_score":
                 lambda s=s, ok=ok: average_precision_score(ok, s)}
        if tm is not None:
          peers["torchmetrics.binary_average_precision"] = (
              lambda ts=ts, tk=tk: tm.binary_average_precision(ts, tk))
      else:
        peers = {"sklearn.average_precision_score":
                 lambda neg=neg, err=err: average_precision_score(err, neg)}
        if tm is not None:
          # 1 - s in float64: exact, so no two distinct scores merge (in float32 they could)
          tneg = torch.from_numpy(1.0 - s.astype(np.float64))
          terr = torch.from_numpy(err.astype(np.int64))
          peers["torchmetrics.binary_average_precision"] = (
              lambda tneg=tneg, terr=terr: tm.binary_average_precision(tneg, terr))
      cases.append(Case("average_precision", {"positive": positive}, variant, n,
                        lambda sj=sj, okj=okj, p=positive: cw.average_precision(sj, okj, positive=p),
                        peers, RANK_TOL, {}))
  return cases


def smooth_cases(n: int, data: dict, relplot_max_n: int) -> list[Case]:
  import relplot  # noqa: PLC0415
  cases = []
  for variant, (c, ok) in data.items():
    cj, okj = jax.device_put(c), jax.device_put(ok)
    skipped = {}
    peers = {}
    c64, ok64 = c.astype(np.float64), ok.astype(np.float64)
    if n > relplot_max_n:
      why = (f"n > --relplot-max-n ({relplot_max_n}): relplot spreads the samples with np.add.at "
             "and convolves its mesh directly (O(mesh^2)), once per step of its bandwidth search")
      skipped = {"relplot.smECE": why}
      sigma = None
    else:
      peers["relplot.smECE"] = lambda c64=c64, ok64=ok64: relplot.smECE(c64, ok64)
      start = time.perf_counter()
      _, sigma = relplot.smECE(c64, ok64, return_width=True)
      print(f"  relplot.smECE n={n} {variant}: {time.perf_counter() - start:.2f} s (bandwidth "
            f"{sigma:g})", file=sys.stderr, flush=True)
    cases.append(Case("smooth_ece", {"bandwidth": "auto"}, variant, n,
                      lambda cj=cj, okj=okj: cw.smooth_ece(cj, okj), peers, SMECE_TOL, skipped))
    if sigma is not None:
      cases.append(Case(
          "smooth_ece", {"bandwidth": float(sigma)}, variant, n,
          lambda cj=cj, okj=okj, sigma=sigma: cw.smooth_ece(cj, okj, bandwidth=sigma),
          {"relplot.smECE_sigma": lambda c64=c64, ok64=ok64, sigma=sigma:
           relplot.smECE_sigma(c64, ok64, sigma)}, SMECE_TOL, {}))
  return cases


def classwise_cases(n: int) -> list[Case]:
  probs, labels = multiclass_data(n)
  pj, lj = jax.device_put(probs), jax.device_put(labels)
  return [Case("classwise_ece", {"num_bins": NUM_BINS, "num_classes": NUM_CLASSES}, "softmax", n,
               lambda: cw.classwise_ece(pj, lj, num_bins=NUM_BINS),
               {"numpy": lambda: numpy_classwise_ece(probs, labels)}, RANK_TOL, {})]


# --------------------------------------------------------------------------- running


def run_case(case: Case, repeats: int, max_seconds: float, min_seconds: float) -> dict:
  """Checks each peer against the kit, then times them interleaved; returns the JSON row."""
  row = {"metric": case.metric, "options": case.options, "data": case.data, "n": case.n,
         "load_average_before": load_average()}
  try:
    start = time.perf_counter()
    kit_value = as_float(jax.block_until_ready(case.kit()))
    row["kit"] = {"value": kit_value, "first_call_s": time.perf_counter() - start}
    row["peers"] = {}
    fns = {"kit": case.kit}
    for name, fn in case.peers.items():
      peer = row["peers"][name] = {}
      try:
        start = time.perf_counter()
        value = as_float(fn())
        peer["first_call_s"] = time.perf_counter() - start
      except Exception as e:  # noqa: BLE001 - a peer's failure is recorded, not fatal
        peer["error"] = f"{type(e).__name__}: {e}"
        continue
      diff = abs(kit_value - value)
      peer.update(value=value, abs_diff=diff, tol=case.tol, ok=bool(diff <= case.tol))
      fns[name] = fn
    for name, why in case.skipped.items():
      row["peers"][name] = {"skipped": why}
    times = interleaved_times(fns, repeats, max_seconds=max_seconds, min_seconds=min_seconds)
  except Exception as e:  # noqa: BLE001 - the kit may be mid-rewrite; report and go on
    row["error"] = f"{type(e).__name__}: {e}"
    row["load_average_after"] = load_average()
    return row
  row["kit"].update(summarize(times["kit"]))
  kit_min = row["kit"]["min_s"]
  for name in fns:
    if name != "kit":
      row["peers"][name].update(summarize(times[name]))
      row["peers"][name]["ratio_kit_over_peer"] = kit_min / row["peers"][name]["min_s"]
  row["load_average_after"] = load_average()
  return row


def describe(row: dict) -> str:
  opts = ",".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                  for k, v in row["options"].items())
  return f"{row['metric']}({opts})" if opts else row["metric"]


def table_lines(row: dict) -> list[str]:
  head = f"{describe(row)[:36]:<36} {row['data']:<8} {row['n']:>9}"
  if "error" in row:
    return [f"{head}  ERROR {row['error'][:100]}"]
  lines = []
  for name, peer in row["peers"].items():
    if "skipped" in peer:
      tail = f"{'skipped':>10}  {name}: {peer['skipped'][:60]}"
    elif "error" in peer:
      tail = f"{'ERROR':>10}  {name}: {peer['error'][:60]}"
    else:
      check = "ok" if peer["ok"] else "MISMATCH"
      tail = (f"{peer['min_s'] * 1e3:>10.3f} {peer['ratio_kit_over_peer']:>7.3f} "
              f"{peer['abs_diff']:>8.1e} {check:<8} {name}")
    lines.append(f"{head} {row['kit']['min_s'] * 1e3:>10.3f} {tail}")
  return lines


def summary(rows: list) -> dict:
  ok_rows = [r for r in rows if "error" not in r]
  peers = [(r, name, p) for r in ok_rows for name, p in r["peers"].items()]
  brief = lambda r, name: {"metric": r["metric"], "options": r["options"], "data": r["data"],  # noqa: E731
                           "n": r["n"], "peer": name}
  ratios, diffs = {}, {}
  for r, name, p in peers:
    key = f"{r['metric']} / {name}"
    if "ratio_kit_over_peer" in p:
      ratios.setdefault(key, []).append(p["ratio_kit_over_peer"])
    if "abs_diff" in p:
      diffs[key] = max(diffs.get(key, 0.0), p["abs_diff"])
  kit_by_n = {}  # how each metric's time grows with n (O(n log n) sorts, O(n + mesh) smECE)
  for r in ok_rows:
    opts = ",".join(f"{k}={'relplot' if k == 'bandwidth' and isinstance(v, float) else v}"
                    for k, v in r["options"].items())
    kit_by_n.setdefault(f"{r['metric']}({opts}) {r['data']}", {})[str(r["n"])] = r["kit"]["min_s"]
  return {
      "kit_min_s_by_n": kit_by_n,
      "checks_failed": [{**brief(r, name), "abs_diff": p["abs_diff"], "tol": p["tol"]}
                        for r, name, p in peers if p.get("ok") is False],
      "max_abs_diff": diffs,
      "ratio_kit_over_peer_range": {k: [min(v), max(v)] for k, v in ratios.items()},
      "skipped": [{**brief(r, name), "why": p["skipped"]} for r, name, p in peers if "skipped" in p],
      "peer_errors": [{**brief(r, name), "error": p["error"]} for r, name, p in peers if "error" in p],
      "errors": [{"metric": r["metric"], "options": r["options"], "data": r["data"], "n": r["n"],
                  "error": r["error"]} for r in rows if "error" in r],
  }


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="a smoke run: n = 1e3, 1e4, 2 repeats")
  parser.add_argument("--sizes", default=None, help="comma-separated n (default 1e4,1e5,1e6,1e7)")
  parser.add_argument("--repeats", type=int, default=None,
                      help="timed rounds (default 5; 2 with --quick; at most 3 at n >= 1e7)")
  parser.add_argument("--min-seconds", type=float, default=None,
                      help="more rounds until a case has taken this long (default 1; 0 with --quick)")
  parser.add_argument("--max-seconds", type=float, default=None,
                      help="stop a case's rounds after this long, at least 2 rounds (default 60; 10 "
                           "with --quick)")
  parser.add_argument("--relplot-max-n", type=float, default=1e6,
                      help="skip relplot above this n (default 1e6)")
  parser.add_argument("--strict", action="store_true", help="exit 1 when a check failed")
  parser.add_argument("--out", default=None, help="also write the JSON here (atomically)")
  args = parser.parse_args(argv)
  if args.sizes:
    sizes = [int(float(s)) for s in args.sizes.split(",")]
  else:
    sizes = [1000, 10_000] if args.quick else [10**4, 10**5, 10**6, 10**7]
  repeats = args.repeats or (2 if args.quick else 5)
  min_seconds = args.min_seconds if args.min_seconds is not None else (0.0 if args.quick else 1.0)
  max_seconds = args.max_seconds if args.max_seconds is not None else (10.0 if args.quick else 60.0)
  relplot_max_n = int(args.relplot_max_n)
  torch, tm, torch_versions = load_torchmetrics()

  load_before = load_average()
  rows = []
  table = [f"{'metric':<36} {'data':<8} {'n':>9} {'kit ms':>10} {'peer ms':>10} {'ratio':>7} "
           f"{'|diff|':>8} {'check':<8} peer"]
  print(table[0], file=sys.stderr, flush=True)
  for n in sizes:
    data = binary_data(n)
    case_repeats = repeats if n < 10**7 else min(repeats, 3)
    cases = (rank_cases(n, data, torch, tm) + smooth_cases(n, data, relplot_max_n)
             + classwise_cases(n))
    for case in cases:
      row = run_case(case, case_repeats, max_seconds, min_seconds)
      rows.append(row)
      for line in table_lines(row):
        table.append(line)
        print(line, file=sys.stderr, flush=True)
    del data, cases
    jax.clear_caches()  # every n compiles its own programs

  s = summary(rows)
  payload = {
      "peers": {"scikit-learn": version("scikit-learn"), "relplot": version("relplot"),
                **torch_versions},
      "torch_threads": torch.get_num_threads() if torch is not None else None,
      "threads_note": "NumPy, scikit-learn and relplot run on one thread; torch and XLA may use "
                      "every core",
      "settings": {
          "quick": args.quick, "sizes": sizes, "repeats": repeats, "min_seconds": min_seconds,
          "max_seconds": max_seconds, "relplot_max_n": relplot_max_n,
          "tolerances": {"ranking_and_classwise_ece": RANK_TOL, "smooth_ece_vs_relplot": SMECE_TOL},
          "tpr_slack": TPR_SLACK,
          "data": {"distinct": "c ~ U(0.3, 1) float32, correct with probability c (seed 0)",
                   "ties": "the same c rounded to 4 decimals (float32), the same correctness",
                   "softmax": f"softmax of 2 * N(0, 1) logits over K = {NUM_CLASSES} classes "
                              "(float32), labels drawn from those probabilities (seed 1)"},
          "timing": "the kit's first call at each shape timed alone (compilation included); then "
                    "the kit and its peers in interleaved rounds (at least `repeats`, more until a "
                    "case took `min_seconds`, none started after `max_seconds`), min (headline) "
                    "and median"},
      "load_average_before": load_before,
      "load_average_after": load_average(),
      "rows": rows,
      "summary": s,
  }
  table.append("")
  table.append(f"checks failed: {len(s['checks_failed'])}; peers skipped: {len(s['skipped'])}; "
               f"errors: {len(s['errors']) + len(s['peer_errors'])}")
  for k, (lo, hi) in s["ratio_kit_over_peer_range"].items():
    table.append(f"  kit / peer {k}: {lo:.3g} - {hi:.3g}")
  emit("peers", payload, table=table[-(len(s["ratio_kit_over_peer_range"]) + 2):], out=args.out)
  failed = s["checks_failed"] or s["errors"]
  return 1 if args.strict and failed else 0


if __name__ == "__main__":
  sys.exit(main())
