"""Slow, obviously-correct float64 NumPy references for the hard CWSA family.

Written straight from the paper's Algorithm 1, one threshold at a time, with
no shared code with the library.
"""

from __future__ import annotations

import math

import numpy as np


def hard_metrics(confidences, correct, tau, normalize="retained"):
  """(coverage, selective_accuracy, cwsa, cwsa_plus) at one threshold, in float64."""
  c = np.asarray(confidences, dtype=np.float64).reshape(-1)
  kappa = np.asarray(correct, dtype=np.float64).reshape(-1)
  tau = float(np.float64(tau))
  n = c.size
  retained = [i for i in range(n) if c[i] >= tau] if n < 2000 else np.flatnonzero(c >= tau)
  retained = np.asarray(retained, dtype=np.int64)
  if retained.size == 0:
    return 0.0, float("nan"), 0.0, 0.0
  phi = (c[retained] - tau) / (1.0 - tau)
  k = kappa[retained]
  denominator = retained.size if normalize == "retained" else n
  return (
      retained.size / n,
      float(np.mean(k)),
      float(np.sum(phi * (2.0 * k - 1.0)) / denominator),
      float(np.sum(phi * k) / retained.size),
  )


def sweep(confidences, correct, thresholds, normalize="retained"):
  """[T, 4] array of hard_metrics at each threshold."""
  return np.array([hard_metrics(confidences, correct, t, normalize) for t in np.asarray(thresholds)])


# ---------------------------------------------------------------------------
# Calibration: explicit bin membership, one bin at a time.
# ---------------------------------------------------------------------------


def width_edges(num_bins):
  """The kit's equal-width edges float32(j) / float32(B), as float64."""
  return (np.arange(num_bins + 1, dtype=np.float32) / np.float32(num_bins)).astype(np.float64)


def mass_edges(confidences, num_bins):
  """0, the sorted confidences at positions ceil(j n / B) (j = 1..B-1, clamped to n - 1), 1."""
  s = np.sort(np.asarray(confidences, np.float32).astype(np.float64))
  n = len(s)
  interior = [s[min(-(-j * n // num_bins), n - 1)] for j in range(1, num_bins)]
  return np.array([0.0, *interior, 1.0]) + 0.0


def calibration_bins(confidences, correct, num_bins=15, binning="width"):
  """(edges, count, mean confidence, accuracy) per bin; a sample's bin is the largest b with
  edges[b] <= c, so the last bin is closed and a value on a (repeated) edge goes up."""
  c = np.asarray(confidences, np.float32).astype(np.float64)
  k = np.asarray(correct, np.float64)
  edges = width_edges(num_bins) if binning == "width" else mass_edges(c, num_bins)
  index = np.array([max(b for b in range(num_bins) if edges[b] <= x) for x in c])
  count = np.array([int((index == b).sum()) for b in range(num_bins)])
  mean_conf = np.array([c[index == b].mean() if count[b] else np.nan for b in range(num_bins)])
  accuracy = np.array([k[index == b].mean() if count[b] else np.nan for b in range(num_bins)])
  return edges, count, mean_conf, accuracy


def ece(confidences, correct, num_bins=15, norm="l1", binning="width"):
  """sum_b n_b / n |conf_b - acc_b| (l1), its root mean square (l2) or max (over non-empty bins)."""
  n = len(confidences)
  _, count, mean_conf, accuracy = calibration_bins(confidences, correct, num_bins, binning)
  gaps = [(count[b], abs(mean_conf[b] - accuracy[b])) for b in range(num_bins) if count[b]]
  if norm == "l1":
    return sum(m / n * g for m, g in gaps)
  if norm == "l2":
    return float(np.sqrt(sum(m / n * g * g for m, g in gaps)))
  return max(g for _, g in gaps)


# ---------------------------------------------------------------------------
# Risk-coverage: one threshold per distinct confidence, no sorting tricks.
# ---------------------------------------------------------------------------


def risk_coverage_points(confidences, correct):
  """(threshold, accepted count k, errors E) for every distinct confidence, high to low."""
  c = np.asarray(confidences, np.float32).astype(np.float64)
  loss = 1.0 - np.asarray(correct, np.float64)
  points = []
  for t in np.unique(c)[::-1]:
    accepted = c >= t
    points.append((t, int(accepted.sum()), float(loss[accepted].sum())))
  return points


def aurc(confidences, correct, convention="step", generalized=False):
  """AURC (or AUGRC with ``generalized``) under "step", "trapezoid" or "published_code"."""
  n = len(confidences)
  if convention == "published_code":
    c = np.asarray(confidences, np.float32).astype(np.float64)
    loss = 1.0 - np.asarray(correct, np.float64)
    order = np.argsort(-c, kind="stable")  # ties in input order
    k = np.arange(1, n + 1)
    cum = np.cumsum(loss[order])
    risk = cum / n if generalized else cum / k
    coverage = k / n
    return float(np.sum((coverage[1:] - coverage[:-1]) * (risk[1:] + risk[:-1]) / 2))
  area, prev_k, prev_r = 0.0, 0, None
  for _, k, e in risk_coverage_points(confidences, correct):
    r = e / n if generalized else e / k
    if convention == "step":
      area += (k - prev_k) / n * r
    else:
      if prev_r is None:
        prev_r = 0.0 if generalized else r
      area += (k - prev_k) / n * (prev_r + r) / 2
    prev_k, prev_r = k, r
  return area


def auroc(scores, correct):
  """Failure AUROC: over (correct, wrong) pairs, 1 when the correct one scores higher, 1/2 on
  a tie; NaN without both kinds."""
  s, k = np.asarray(scores, np.float64), np.asarray(correct, bool)
  positives, negatives = s[k], s[~k]
  if positives.size == 0 or negatives.size == 0:
    return np.nan
  total = 0.0
  for x in positives:
    total += np.sum(x > negatives) + 0.5 * np.sum(x == negatives)
  return total / (positives.size * negatives.size)


def fpr_at_tpr(scores, correct, tpr, slack=1e-12):
  """The smallest fraction of wrong predictions accepted (``s >= t``, t over the distinct
  scores) among the thresholds accepting at least ``tpr - slack`` of the correct ones."""
  s, k = np.asarray(scores, np.float64), np.asarray(correct, bool)
  p, n = k.sum(), (~k).sum()
  if p == 0 or n == 0:
    return np.nan
  best = np.inf
  for t in np.unique(s):
    accepted = s >= t
    if (accepted & k).sum() / p >= tpr - slack:
      best = min(best, (accepted & ~k).sum() / n)
  return float(best)


def average_precision(scores, correct, positive="correct"):
  """scikit-learn's step-wise AP over the distinct thresholds from the top; ``"error"``: the
  wrong predictions ranked by the negated score. NaN without a positive."""
  s, k = np.asarray(scores, np.float64), np.asarray(correct, bool)
  if positive == "error":
    s, k = -s, ~k
  if k.sum() == 0:
    return np.nan
  total, previous_recall = 0.0, 0.0
  for t in np.unique(s)[::-1]:  # decreasing thresholds
    accepted = s >= t
    recall = (accepted & k).sum() / k.sum()
    total += (recall - previous_recall) * (accepted & k).sum() / accepted.sum()
    previous_recall = recall
  return total


def oracle_scores(correct, convention):
  """A scoring of the outcomes that reaches the smallest AURC of the convention: every correct
  sample above every error, strictly ordered ("step", "published_code") or two tied levels
  ("trapezoid")."""
  ok = np.asarray(correct, bool)
  if convention == "trapezoid":
    return np.where(ok, 1.0, 0.5)
  rank = np.empty(len(ok))
  rank[np.argsort(~ok, kind="stable")] = np.arange(len(ok))
  return 1.0 - rank / len(ok)


def eaurc(confidences, correct, convention="step"):
  """AURC minus the oracle scoring's AURC under the same convention (0 with a single class)."""
  ok = np.asarray(correct, bool)
  if ok.all() or not ok.any():
    return 0.0
  excess = aurc(confidences, ok, convention) - aurc(oracle_scores(ok, convention), ok, convention)
  return max(excess, 0.0)


def eaurc_fsum(ok_sorted: np.ndarray, ends: np.ndarray, convention: str) -> float:
  """AURC minus the oracle's AURC in float64 ("step" or "trapezoid", tie groups ending at
  ``ends``): every term rounded once or twice and summed exactly (``math.fsum``), so the
  difference is good to about 1e-16 of the AURC."""
  n = ok_sorted.size
  m = int(ok_sorted.sum())
  errors = np.cumsum(~ok_sorted)[ends - 1].astype(np.float64)
  width = np.diff(np.concatenate([[0], ends])).astype(np.float64)
  risk = errors / ends
  if convention == "step":
    area = math.fsum(width * risk)
    p = np.arange(m + 1, n + 1, dtype=np.float64)
    oracle = math.fsum((p - m) / p)  # the strict order, correct samples first
  else:
    previous = np.concatenate([risk[:1], risk[:-1]])
    area = math.fsum(width * (previous + risk) / 2)
    oracle = (n - m) ** 2 / (2 * n)  # all correct tied above all errors tied: n (E/n)^2 / 2
  return (area - oracle) / n

def risk_coverage_curve(confidences, correct):
  """(thresholds, coverage, risk, generalized risk) at every distinct confidence, high to low."""
  n = len(confidences)
  points = risk_coverage_points(confidences, correct)
  return (np.array([t for t, _, _ in points]), np.array([k / n for _, k, _ in points]),
          np.array([e / k for _, k, e in points]), np.array([e / n for _, _, e in points]))


# ---------------------------------------------------------------------------
# Groups, threshold selection, bootstrap: loops over the references above.
# ---------------------------------------------------------------------------


def sweep_by_group(confidences, correct, groups, thresholds, num_groups, normalize="retained"):
  """[G, T, 4]: ``sweep`` of each group's samples (NaN for an empty group)."""
  c = np.asarray(confidences)
  k = np.asarray(correct)
  g = np.asarray(groups)
  out = np.full((num_groups, len(thresholds), 4), np.nan)
  for group in range(num_groups):
    if np.any(g == group):
      out[group] = sweep(c[g == group], k[g == group], thresholds, normalize)
  return out


def select_threshold(confidences, correct, thresholds, metric="cwsa", min_coverage=None,
                     max_risk=None, slack=1e-6):
  """(threshold, coverage, selective risk, value) maximising the metric over the feasible grid
  thresholds (something retained, coverage >= min_coverage - slack, risk <= max_risk + slack);
  equal float32 values go to the smallest threshold."""
  column = {"selective_accuracy": 1, "cwsa": 2, "cwsa_plus": 3}[metric]
  best = None
  for t in np.asarray(thresholds, np.float32):
    cov, acc, *values = hard_metrics(confidences, correct, t)
    value = [acc, *values][column - 1]
    risk = 1.0 - acc
    if cov == 0 or (min_coverage is not None and cov < min_coverage - slack):
      continue
    if max_risk is not None and not risk <= max_risk + slack:
      continue
    key = (np.float32(value), -float(t))
    if best is None or key > best[0]:
      best = (key, (float(t), cov, risk, value))
  if best is None:
    raise ValueError("no feasible threshold")
  return best[1]


def bootstrap(fn, confidences, correct, indices, level=0.95):
  """(fn(data), low, high): NumPy's linear percentiles (NaN left out) of fn over the resamples
  ``indices`` [B, n], one resample at a time."""
  c = np.asarray(confidences)
  k = np.asarray(correct)
  samples = np.array([fn(c[i], k[i]) for i in np.asarray(indices)], np.float64)
  q = [(1.0 - level) / 2.0, (1.0 + level) / 2.0]
  low, high = np.nanquantile(samples, q, axis=0)
  return np.asarray(fn(c, k), np.float64), low, high


# ---------------------------------------------------------------------------
# Proper scoring rules, in float64 (no float32 rounding: usable for finite differences).
# ---------------------------------------------------------------------------


def softmax(logits):
  z = np.asarray(logits, np.float64)
  e = np.exp(z - z.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)


def brier_score(probs, labels):
  """mean_i sum_k (p_ik - [y_i = k])^2."""
  p = np.asarray(probs, np.float64)
  one_hot = np.eye(p.shape[-1])[np.asarray(labels)]
  return float(np.mean(np.sum((p - one_hot) ** 2, axis=-1)))


def nll(probs, labels):
  """-mean_i log p_{i, y_i}."""
  p = np.asarray(probs, np.float64)
  return float(-np.mean(np.log(p[np.arange(len(p)), np.asarray(labels)])))
