"""The metrics dictionary, figures and ``report.md`` shared by ``demo`` and ``evaluate``.

:func:`compute_metrics` evaluates every metric of the kit on (confidences,
correct) arrays of shape [..., n] (leading axes: seeds or models), with the
conventions in :class:`Settings`. :func:`to_json` turns one model's result
into plain JSON (NaN becomes ``null``), :func:`summarize` turns a batch into
mean / std. The report helpers write Markdown tables and the figures.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax.numpy as jnp
import numpy as np

from cwsa_jax import plots
from cwsa_jax._aumcc import aumcc
from cwsa_jax._calibration import calibration_bins, ece
from cwsa_jax._cli_util import UserError
from cwsa_jax._decompose import contributions, most_damaging
from cwsa_jax._groups import FIELDS as GROUP_FIELDS
from cwsa_jax._groups import group_gap, sweep_by_group
from cwsa_jax._risk_coverage import risk_coverage_curve, risk_coverage_summary
from cwsa_jax._select import select_threshold
from cwsa_jax._sweep import sweep

SWEEP_FIELDS = ("thresholds", "coverage", "selective_accuracy", "cwsa", "cwsa_plus")
AUMCC_METRICS = ("cwsa", "cwsa_plus", "selective_accuracy")
SCALAR_FIELDS = ("accuracy", "ece", "aurc", "eaurc", "augrc")


def default_thresholds() -> np.ndarray:
  """0.50, 0.51, ..., 0.99 (the paper's text)."""
  return plots.default_thresholds()


def published_code_thresholds() -> np.ndarray:
  """``np.linspace(0.5, 0.99, 20)``: the grid of the paper's published code."""
  return np.linspace(0.5, 0.99, 20).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Settings:
  """Metric conventions (defaults: the library's; see ``evaluate --help``)."""
  thresholds: tuple[float, ...] = tuple(float(t) for t in default_thresholds())
  num_bins: int = 15
  binning: str = "width"
  ece_norm: str = "l1"
  aurc_convention: str = "step"
  normalize: str = "retained"
  aumcc_axis: str = "coverage"
  min_coverage: float = 0.8

  def to_json(self) -> dict[str, Any]:
    return {
        "thresholds": [round(t, 6) for t in self.thresholds],
        "ece": {"num_bins": self.num_bins, "binning": self.binning, "norm": self.ece_norm},
        "aurc_convention": self.aurc_convention,
        "cwsa_normalize": self.normalize,
        "aumcc": {"axis": self.aumcc_axis, "rule": "trapezoid", "normalized": False,
                  "caveat": aumcc_caveat(self.aumcc_axis)},
        "threshold_selection": {"metric": DEFAULT_SELECTION["metric"],
                                "min_coverage": self.min_coverage},
    }

  def describe(self) -> list[tuple[str, str]]:
    """(setting, value) rows for a report."""
    t = np.asarray(self.thresholds)
    step = np.diff(t)
    if t.size > 2 and np.allclose(step, step[0], atol=1e-6):
      grid = f"{t[0]:.4g} to {t[-1]:.4g}, {t.size} points, step {step[0]:.4g}"
    else:
      grid = ", ".join(f"{x:.4g}" for x in t)
    cwsa_norm = ("retained: divide by the retained count |S| (the paper's definition)"
                 if self.normalize == "retained" else
                 "all: divide by n (the paper's published code; equals coverage x CWSA)")
    return [
        ("thresholds", grid),
        ("CWSA normalisation", cwsa_norm),
        ("ECE", f"{self.num_bins} {'equal-width' if self.binning == 'width' else 'equal-mass'} "
                f"bins, norm {self.ece_norm} (top-label; the last bin includes 1.0)"),
        ("AURC / AUGRC / E-AURC", f"convention {self.aurc_convention!r}"),
        ("AUMCC", f"trapezoid over the {self.aumcc_axis} axis of the threshold grid, not normalised "
                  f"(see {AUMCC_MARK} beside the values)"),
        ("deployment threshold", f"largest CWSA on the grid with coverage ≥ {self.min_coverage:g} "
                                 "(`--min-coverage`)"),
    ]


def check_min_coverage(value: float) -> float:
  """``--min-coverage`` must be a fraction in [0, 1].

  Raises:
    UserError: outside [0, 1] or NaN.
  """
  if not (0.0 <= value <= 1.0):  # also rejects NaN
    raise UserError(f"--min-coverage must lie in [0, 1], got {value:g}")
  return float(value)


def add_min_coverage_flag(parser: Any) -> None:
  """``--min-coverage``: the coverage the reported deployment threshold must keep."""
  default = DEFAULT_SELECTION["min_coverage"]
  parser.add_argument("--min-coverage", type=float, default=default, metavar="FRACTION",
                      help="the deployment threshold stated in the report is the one with the "
                      f"largest CWSA among those keeping at least this coverage (default {default:g})")


def parse_thresholds(spec: str) -> np.ndarray:
  """Threshold grid from ``START:STOP:STEP`` (inclusive), ``linspace:START:STOP:NUM`` or ``a,b,c``.

  Raises:
    UserError: on a malformed spec or thresholds outside [0, 1).
  """
  text = spec.strip()
  try:
    if text.startswith("linspace:"):
      start, stop, num = text[len("linspace:"):].split(":")
      values = np.linspace(float(start), float(stop), int(num))
    elif ":" in text:
      start, stop, step = (float(x) for x in text.split(":"))
      if step <= 0:
        raise ValueError("step must be > 0")
      count = int(math.floor((stop - start) / step + 1e-9)) + 1
      if count < 1 or count > 100_000:
        raise ValueError(f"{count} thresholds")
      values = np.round(start + step * np.arange(count), 10)
    else:
      values = np.array([float(x) for x in text.split(",") if x.strip()], dtype=np.float64)
  except ValueError as e:
    raise UserError(f"--thresholds {spec!r}: expected START:STOP:STEP, linspace:START:STOP:NUM "
                    f"or a comma-separated list ({e})") from None
  if values.size < 1:
    raise UserError(f"--thresholds {spec!r}: no thresholds")
  if not np.all(np.isfinite(values)) or values.min() < 0 or values.max() >= 1:
    raise UserError(f"--thresholds {spec!r}: thresholds must lie in [0, 1)")
  return np.unique(values.astype(np.float32))


# --------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------


def compute_metrics(confidences: Any, correct: Any, settings: Settings) -> dict[str, Any]:
  """Every metric of the kit on [..., n] inputs.

  Returns:
    dict with ``n`` (int), the scalar metrics ``accuracy``, ``ece``, ``aurc``,
    ``eaurc``, ``augrc`` (NumPy [...]), ``aumcc`` (dict metric -> [...]) and
    ``sweep`` (dict of the sweep fields, [..., T]).
  """
  c = jnp.asarray(confidences, jnp.float32)
  ok = jnp.asarray(correct, jnp.bool_)
  thresholds = np.asarray(settings.thresholds, np.float32)
  result = sweep(c, ok, thresholds, normalize=settings.normalize)
  summary = risk_coverage_summary(c, ok, convention=settings.aurc_convention)
  out: dict[str, Any] = {
      "n": int(c.shape[-1]),
      "accuracy": np.asarray(ok).mean(axis=-1, dtype=np.float64).astype(np.float32),
      "ece": np.asarray(ece(c, ok, num_bins=settings.num_bins, norm=settings.ece_norm,
                            binning=settings.binning)),
      "aurc": np.asarray(summary.aurc),
      "eaurc": np.asarray(summary.eaurc),
      "augrc": np.asarray(summary.augrc),
  }
  if thresholds.size >= 2:
    out["aumcc"] = {m: np.asarray(aumcc(c, ok, thresholds, metric=m, axis=settings.aumcc_axis,
                                        normalize=settings.normalize))
                    for m in AUMCC_METRICS}
  else:
    nan = np.full(c.shape[:-1], np.nan, np.float32)
    out["aumcc"] = {m: nan for m in AUMCC_METRICS}
  out["sweep"] = {
      "thresholds": thresholds,
      "coverage": np.asarray(result.coverage),
      "selective_accuracy": np.asarray(result.selective_accuracy),
      "cwsa": np.asarray(result.cwsa),
      "cwsa_plus": np.asarray(result.cwsa_plus),
  }
  return out


# The deployment threshold stated in the reports: best CWSA with at least 80 % coverage by
# default (``Settings.min_coverage``, the commands' ``--min-coverage``).
DEFAULT_SELECTION = {"metric": "cwsa", "min_coverage": 0.8}
GROUP_TAUS = (0.5, 0.9)
MAX_GROUP_ROWS = 30


def group_metrics(confidences: Any, correct: Any, groups: Any, names: Sequence[str],
                  settings: Settings) -> dict[str, Any]:
  """Per-group sweep (:func:`sweep_by_group`) and best-worst gap (:func:`group_gap`) on the grid.

  Args:
    confidences, correct: [n] arrays.
    groups: [n] int ids in [0, len(names)).
    names: the group labels, in id order.

  Returns:
    dict with ``names``, ``counts`` [G], ``sweep`` (fields [G, T]) and ``gap``
    (fields [T], NaN-free groups only).
  """
  ids = np.asarray(groups, np.int64)
  num_groups = len(names)
  thresholds = np.asarray(settings.thresholds, np.float32)
  result = sweep_by_group(jnp.asarray(confidences, jnp.float32), jnp.asarray(correct, jnp.bool_),
                          ids, thresholds, num_groups=num_groups, normalize=settings.normalize)
  return {
      "names": [str(x) for x in names],
      "counts": np.bincount(ids, minlength=num_groups),
      "sweep": {"thresholds": thresholds,
                **{f: np.asarray(getattr(result, f)) for f in GROUP_FIELDS}},
      "gap": {f: np.asarray(group_gap(result, f)) for f in GROUP_FIELDS},
  }


def class_groups(labels: Any) -> tuple[np.ndarray, tuple[str, ...]]:
  """Group ids of the true classes (sorted label values) and their names."""
  unique, ids = np.unique(np.asarray(labels, np.int64), return_inverse=True)
  return ids.astype(np.int64), tuple(str(int(u)) for u in unique)


def choose_threshold(confidences: Any, correct: Any, settings: Settings) -> dict[str, Any]:
  """:func:`select_threshold` on the report's grid: best CWSA with coverage >= ``settings.min_coverage``.

  Returns a JSON-ready dict with ``feasible``; when the constraint cannot be
  met, ``reason`` holds the library's message instead of a threshold.
  """
  out: dict[str, Any] = dict(DEFAULT_SELECTION, min_coverage=settings.min_coverage)
  try:
    choice = select_threshold(np.asarray(confidences, np.float32), np.asarray(correct, bool),
                              thresholds=np.asarray(settings.thresholds, np.float32), **out)
  except ValueError as e:
    out.update(feasible=False, reason=str(e))
    return out
  out.update(feasible=True, **choice._asdict())
  return out


def choice_sentence(choice: Mapping[str, Any]) -> str:
  """One Markdown sentence stating the selected threshold (or why there is none)."""
  constraint = (f"maximising {plots.METRIC_LABELS.get(choice['metric'], choice['metric'])} "
                f"(divided by |S|) over the threshold grid subject to coverage ≥ "
                f"{choice['min_coverage']:g} (`--min-coverage`)")
  if not choice["feasible"]:
    return f"**Deployment threshold**: none — {constraint} is infeasible: {choice['reason']}."
  return (f"**Deployment threshold** ({constraint}, `select_threshold`): τ = "
          f"{choice['threshold']:.4g}, with coverage {fmt(choice['coverage'])}, selective risk "
          f"{fmt(choice['selective_risk'])} and {choice['metric'].upper().replace('_PLUS', '+')} "
          f"{fmt(choice['value'])}.")


def worst_samples(confidences: Any, correct: Any, k: int, tau: float) -> dict[str, Any]:
  """The ``k`` most damaging samples (most negative CWSA terms) at threshold ``tau``."""
  c = np.asarray(confidences, np.float32)
  result = contributions(c, np.asarray(correct, bool), np.float32(tau))
  index = np.asarray(most_damaging(result, k=k))
  terms = np.asarray(result.terms)
  return {"tau": float(np.float32(tau)), "k": k,
          "samples": [{"index": int(i), "confidence": float(c[i]), "term": float(terms[i])}
                      for i in index]}


def _json_value(x: Any) -> Any:
  if isinstance(x, Mapping):
    return {k: _json_value(v) for k, v in x.items()}
  arr = np.asarray(x)
  if arr.ndim == 0:
    v = arr.item()
    if isinstance(v, float):
      return None if not math.isfinite(v) else round(v, 8)
    return v
  return [_json_value(v) for v in arr]


def to_json(metrics: Mapping[str, Any]) -> dict[str, Any]:
  """One model's metrics as plain JSON (floats rounded to 8 digits, NaN -> null)."""
  return _json_value(metrics)


def _nan_stats(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  values = np.asarray(values, np.float64)
  finite = np.isfinite(values)
  count = finite.sum(axis=0)
  total = np.where(finite, values, 0.0).sum(axis=0)
  mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
  sq = np.where(finite, (values - mean) ** 2, 0.0).sum(axis=0)
  std = np.where(count > 1, np.sqrt(sq / np.maximum(count - 1, 1)), np.where(count == 1, 0.0, np.nan))
  return mean, std


def summarize(metrics: Mapping[str, Any]) -> dict[str, Any]:
  """Mean and sample std over the leading (seed) axis, ignoring NaN.

  Every array ``x`` of shape [S, ...] becomes ``{"mean": [...], "std": [...]}``;
  ``n`` and the thresholds are kept as they are.
  """
  out: dict[str, Any] = {}
  for key, value in metrics.items():
    if key == "n":
      out[key] = value
    elif isinstance(value, Mapping):
      out[key] = {k: (np.asarray(v) if k == "thresholds" else _pair(v)) for k, v in value.items()}
    else:
      out[key] = _pair(value)
  return out


def _pair(values: Any) -> dict[str, np.ndarray]:
  mean, std = _nan_stats(values)
  return {"mean": mean, "std": std}


# --------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------


def _decimals(v: float, digits: int, significant: int) -> int:
  """Decimals that show ``v`` with at least ``digits`` decimals and ``significant`` digits."""
  if v == 0:
    return digits
  return max(digits, significant - 1 - math.floor(math.log10(abs(v))))


def fmt(x: Any, digits: int = 4, *, significant: int = 3) -> str:
  """A number with ``digits`` decimals, more where needed to keep ``significant`` digits.

  0.9647 stays ``0.9647``, 0.000813 is ``0.000813`` (not ``0.0008``), exactly
  0 is ``0``; below 1e-8 in magnitude, scientific notation. NaN / None: an em dash.
  """
  if x is None:
    return "—"
  v = float(x)
  if not math.isfinite(v):
    return "—"
  if v == 0:
    return "0"
  decimals = _decimals(v, digits, significant)
  if decimals > 8:
    return f"{v:.{significant - 1}e}"
  return f"{v:.{decimals}f}"


def fmt_pm(mean: Any, std: Any, digits: int = 4, *, significant: int = 3) -> str:
  """``mean ± std``, both with the decimals :func:`fmt` gives the mean."""
  if mean is None or not math.isfinite(float(mean)):
    return "—"
  m, s = float(mean), float(std)
  if m == 0 and s == 0:
    return "0 ± 0"
  decimals = _decimals(m if m != 0 else s, digits, significant)
  if decimals > 8:
    return f"{m:.{significant - 1}e} ± {s:.1e}"
  return f"{m:.{decimals}f} ± {s:.{decimals}f}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
                   align: str | None = None) -> str:
  """A GitHub-flavoured Markdown table; ``align`` is one of l/r/c per column."""
  align = align or "l" + "r" * (len(headers) - 1)
  marks = {"l": ":---", "r": "---:", "c": ":---:"}
  lines = ["| " + " | ".join(headers) + " |",
           "| " + " | ".join(marks[a] for a in align) + " |"]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def text_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  """A plain-text table for the terminal (first column left-aligned)."""
  cells = [list(map(str, headers))] + [list(map(str, r)) for r in rows]
  widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

  def line(r):
    return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

  return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]])


def selected_rows(thresholds: np.ndarray, max_rows: int = 12) -> list[int]:
  """Indices of a readable subset of the grid: every 0.05 plus the last point."""
  t = np.asarray(thresholds, np.float64)
  if t.size <= max_rows:
    return list(range(t.size))
  marks = np.arange(0.5, 1.0, 0.05)
  picked = {int(np.argmin(np.abs(t - m))) for m in marks if t.min() - 0.01 <= m <= t.max() + 0.01}
  picked.add(t.size - 1)
  picked.add(0)
  return sorted(picked)


def fresh_output_dir(base: str) -> Path:
  """``base`` if it does not exist, else ``base-2``, ``base-3``, ... (for default output dirs).

  Stale temporaries of earlier runs in the folder are removed first, and an
  earlier result a killed run had moved aside is put back (:func:`_output.clean_stale`).
  """
  from cwsa_jax import _output  # noqa: PLC0415
  path = Path(base)
  _output.clean_stale(path.parent)
  if not os.path.lexists(path):
    return path
  for i in range(2, 10_000):
    candidate = path.with_name(f"{path.name}-{i}")
    if not os.path.lexists(candidate):
      return candidate
  raise UserError(f"too many earlier outputs named {base}-N; pass --out DIR")


# --------------------------------------------------------------------------
# One model: figures and report
# --------------------------------------------------------------------------


def write_model_figures(out_dir: Path, confidences: Any, correct: Any, metrics: Mapping[str, Any],
                        settings: Settings, *, name: str,
                        choice: Mapping[str, Any] | None = None) -> list[tuple[str, str]]:
  """threshold_curves.png, reliability_diagram.png, risk_coverage.png; returns (file, caption).

  A feasible ``choice`` (from :func:`choose_threshold`) is marked on the curves.
  """
  figures = []
  sweep_fields = metrics["sweep"]
  cwsa_label = "CWSA" if settings.normalize == "retained" else "CWSA ÷ n (published code)"
  marker = choice["threshold"] if choice is not None and choice["feasible"] else None
  fig = plots.threshold_curves(sweep_fields, title=f"{name}: selective metrics vs. threshold",
                               labels={"cwsa": cwsa_label}, marker=marker,
                               marker_label=None if marker is None else marker_text(choice))
  plots.save(fig, out_dir / "threshold_curves.png")
  figures.append(("threshold_curves.png", "Selective accuracy, CWSA, CWSA+ and coverage vs. threshold "
                  "(thresholds that retain nothing are shaded and left out of the lines)."))
  bins = calibration_bins(confidences, correct, num_bins=settings.num_bins, binning=settings.binning)
  fig = plots.reliability_diagram(bins, title=f"{name}: reliability diagram",
                                  ece=float(np.asarray(metrics["ece"])))
  plots.save(fig, out_dir / "reliability_diagram.png")
  figures.append(("reliability_diagram.png", reliability_caption(settings)))
  curve = risk_coverage_curve(confidences, correct)
  label = (f"{name} (AURC {fmt(np.asarray(metrics['aurc']))}, "
           f"AUGRC {fmt(np.asarray(metrics['augrc']))})")
  fig = plots.risk_coverage({name: curve}, title=f"{name}: risk-coverage curves",
                            labels={name: label})
  plots.save(fig, out_dir / "risk_coverage.png")
  figures.append(("risk_coverage.png", "Selective risk and generalized risk vs. coverage."))
  return figures


def reliability_caption(settings: Settings) -> str:
  """Caption of a reliability diagram: bins, gap colours and the minimum count."""
  kind = "equal-width" if settings.binning == "width" else "equal-mass"
  return (f"Reliability diagram, {settings.num_bins} {kind} bins: accuracy per bin (blue) against "
          "its mean confidence (black tick); red boxes: confidence above accuracy, orange "
          f"hatching: accuracy above confidence; bins with fewer than {plots.RELIABILITY_MIN_COUNT} "
          "samples in grey without a gap box. Below: the sample count per bin (log axis).")


def marker_text(choice: Mapping[str, Any]) -> str:
  """Legend text of the selected threshold."""
  return f"selected τ = {choice['threshold']:.3g} (coverage ≥ {choice['min_coverage']:g})"


def _nearest(thresholds: np.ndarray, tau: float) -> int:
  return int(np.argmin(np.abs(np.asarray(thresholds, np.float64) - tau)))


def group_section(title: str, groups: Mapping[str, Any], key: str) -> list[str]:
  """Markdown lines: per-group coverage, selective accuracy and CWSA at τ ≈ 0.5 and 0.9."""
  thresholds = np.asarray(groups["sweep"]["thresholds"])
  cols = [_nearest(thresholds, t) for t in GROUP_TAUS]
  headers = ["group", "n"]
  for j in cols:
    tau = f"{thresholds[j]:.3g}"
    headers += [f"coverage@{tau}", f"sel. acc.@{tau}", f"CWSA@{tau}"]
  fields = ("coverage", "selective_accuracy", "cwsa")
  rows = []
  names = groups["names"]
  for g, name in enumerate(names[:MAX_GROUP_ROWS]):
    row = [str(name), str(int(groups["counts"][g]))]
    for j in cols:
      row += [fmt(groups["sweep"][f][g][j]) for f in fields]
    rows.append(row)
  gap = ["best − worst", ""]
  for j in cols:
    gap += [fmt(groups["gap"][f][j]) for f in fields]
  rows.append(gap)
  more = (f" Only the first {MAX_GROUP_ROWS} of {len(names)} groups are shown."
          if len(names) > MAX_GROUP_ROWS else "")
  return [f"## {title}", "", markdown_table(headers, rows), "",
          f"Every group's full sweep and the best-worst gap at each threshold are in "
          f"`metrics.json` (`{key}`); empty retained sets show as —.{more}", ""]


def worst_section(worst: Mapping[str, Any]) -> list[str]:
  """Markdown lines listing the most damaging samples."""
  rows = [[str(s["index"]), fmt(s["confidence"]), fmt(s["term"])] for s in worst["samples"]]
  lines = [f"## Most damaging samples (τ = {worst['tau']:.4g})", "",
           f"The (at most) {worst['k']} retained wrong predictions with the most negative CWSA "
           f"terms φ(c)(2·correct − 1), i.e. the most confident mistakes (`most_damaging`); the "
           "index is the 0-based position in the input.", ""]
  if rows:
    lines += [markdown_table(("index", "confidence", "CWSA term"), rows), ""]
  else:
    lines += ["No retained prediction is wrong.", ""]
  return lines


CONVENTIONS_NOTE = f"""\
- **CWSA** at threshold τ averages φ(c) = (c − τ)/(1 − τ) times +1 (correct) or −1 (wrong) over
  the retained set S = {{c ≥ τ}}, divided by |S| as the paper defines it (0 when S is empty).
  The paper's published code divides by n instead, so its CWSA equals coverage × CWSA; use
  `--normalize all` to get that variant. CWSA+ rewards correct predictions only and divides by |S|
  in both.
- **Selective accuracy** is undefined (shown as —, `null` in JSON) where nothing is retained.
- **ECE** uses top-label confidence; the last bin is closed, so a confidence of exactly 1.0 counts
  (the published code drops it).
- **AURC** conventions: `step` is the exact area under the tie-grouped empirical curve;
  `trapezoid` joins the tie-group points; `published_code` reproduces the paper's code
  (trapezoid over coverage 1/n..1, no tie grouping). E-AURC subtracts the best AURC any ranking
  of the same outcomes reaches under the same convention. AUGRC (Traub et al., 2024) uses
  errors accepted / n.
- **AUMCC** is the trapezoid area under the metric-coverage curve of the threshold grid
  (coverage on the x axis; not normalised; thresholds that retain nothing are left out), so it
  compares models only when their coverage spans match: see the note beside each AUMCC value.
- **Empty retained set**: CWSA and CWSA+ are 0 there by the paper's convention, which tables
  show as "0 (S empty)" and figures leave out of the lines (shaded, or marked with an x at 0).
- **Reliability diagrams** grey out bins with fewer than {plots.RELIABILITY_MIN_COUNT} samples (their
  accuracy is too noisy to read) and draw no gap box for them; the lower panel prints every bin's
  count.
"""


AUMCC_MARK = "†"


def aumcc_caveat(axis: str = "coverage") -> str:
  """Why an AUMCC value alone does not rank models (stated wherever AUMCC is shown)."""
  if axis == "threshold":
    return ("AUMCC is the area under the metric-vs-threshold curve, not normalised: it depends "
            "on the threshold range of the grid as well as on the metric, and thresholds that "
            "retain nothing add no area; compare it only between models on the same grid that "
            "retain something at the same thresholds.")
  return ("AUMCC is the area under the metric-vs-coverage curve of the threshold grid, not "
          "normalised: it scales with the coverage span the grid sweeps as well as with the "
          "metric, so a model whose confidences mostly exceed the top threshold (or sit below "
          "the lowest) sweeps little coverage and scores low however good it is (0 if its "
          "coverage never changes); compare it only between models with similar coverage spans, "
          "or divide by the span for a mean metric value.")


def coverage_span(coverage: Any) -> tuple[np.ndarray, np.ndarray]:
  """Highest and lowest non-zero coverage of a sweep ([..., T]): the range AUMCC integrates over.

  NaN where no threshold retains anything.
  """
  cov = np.asarray(coverage, np.float64)
  nonzero = cov > 0
  high = np.where(nonzero.any(axis=-1), np.where(nonzero, cov, -np.inf).max(axis=-1), np.nan)
  low = np.where(nonzero.any(axis=-1), np.where(nonzero, cov, np.inf).min(axis=-1), np.nan)
  return high, low


def aumcc_note(metrics: Mapping[str, Any], settings: Settings) -> str:
  """The AUMCC caveat for one model, with its coverage span and span-normalised values."""
  text = f"{AUMCC_MARK} {aumcc_caveat(settings.aumcc_axis)}"
  if settings.aumcc_axis != "coverage":
    return text
  high, low = (float(x) for x in coverage_span(metrics["sweep"]["coverage"]))
  if not math.isfinite(high):
    return text + " Here no threshold retains anything."
  span = high - low
  text += f" Here the grid sweeps coverage {fmt(high)} down to {fmt(low)} (span {fmt(span)})"
  if span <= 0:
    return text + "."
  means = ", ".join(f"{plots.METRIC_LABELS[m]} {fmt(float(np.asarray(metrics['aumcc'][m])) / span)}"
                    for m in AUMCC_METRICS)
  return text + f"; AUMCC ÷ span: {means}."


def scalar_rows(metrics: Mapping[str, Any]) -> list[tuple[str, str]]:
  """(metric, value) rows for one model; AUMCC rows carry :data:`AUMCC_MARK` (see :func:`aumcc_note`)."""
  rows = [("samples (n)", str(metrics["n"]))]
  rows += [(plots.METRIC_LABELS.get(k, k), fmt(np.asarray(metrics[k]))) for k in SCALAR_FIELDS]
  for m in AUMCC_METRICS:
    rows.append((f"AUMCC ({plots.METRIC_LABELS[m]}) {AUMCC_MARK}",
                 fmt(np.asarray(metrics["aumcc"][m]))))
  for extra in ("brier", "nll"):
    if extra in metrics:
      rows.append(({"brier": "Brier score", "nll": "NLL"}[extra], fmt(np.asarray(metrics[extra]))))
  return rows


EMPTY_CELL = "0 (S empty)"


def fmt_convention(value: Any, coverage: Any, std: Any = None) -> str:
  """CWSA / CWSA+ cell: :data:`EMPTY_CELL` where nothing is retained (coverage 0), else the value."""
  if float(coverage) == 0:
    return EMPTY_CELL
  return fmt(value) if std is None else fmt_pm(value, std)


def sweep_rows(sweep_fields: Mapping[str, Any], indices: Sequence[int] | None = None) -> list[list[str]]:
  """Table rows (τ, coverage, selective accuracy, CWSA, CWSA+); CWSA at an empty S is marked."""
  t = np.asarray(sweep_fields["thresholds"])
  indices = range(t.size) if indices is None else indices
  cov = sweep_fields["coverage"]
  return [[f"{t[i]:.4g}", fmt(cov[i]), fmt(sweep_fields["selective_accuracy"][i]),
           fmt_convention(sweep_fields["cwsa"][i], cov[i]),
           fmt_convention(sweep_fields["cwsa_plus"][i], cov[i])] for i in indices]


SWEEP_HEADERS = ("τ", "coverage", "sel. accuracy", "CWSA", "CWSA+")


def evaluation_report(*, title: str, source: str, metrics: Mapping[str, Any], settings: Settings,
                      figures: Sequence[tuple[str, str]], command: str) -> str:
  """Markdown for one evaluated model."""
  sweep_fields = metrics["sweep"]
  parts = [
      f"# {title}",
      "",
      f"Predictions: `{source}`. Generated by `{command}`.",
      "",
      "## Summary",
      "",
      markdown_table(("metric", "value"), scalar_rows(metrics)),
      "",
      aumcc_note(metrics, settings),
      "",
      "## Threshold sweep",
      "",
      markdown_table(SWEEP_HEADERS, sweep_rows(sweep_fields)),
      "",
      "The full sweep is in `metrics.json` (`sweep`).",
      "",
  ]
  if "threshold_choice" in metrics:
    parts += [choice_sentence(metrics["threshold_choice"]), ""]
  if "classes" in metrics:
    parts += group_section("Per-class breakdown (true class)", metrics["classes"], "classes")
  if "groups" in metrics:
    parts += group_section(f"Per-group breakdown (column `{metrics['groups']['column']}`)",
                           metrics["groups"], "groups")
  if "worst" in metrics:
    parts += worst_section(metrics["worst"])
  if figures:
    parts += ["## Figures", ""]
    for file, caption in figures:
      parts += [f"![{caption}]({file})", "", f"*{caption}*", ""]
  parts += ["## Settings", "", markdown_table(("setting", "value"), settings.describe(), "ll"), "",
            "## Conventions", "", CONVENTIONS_NOTE]
  return "\n".join(parts)
