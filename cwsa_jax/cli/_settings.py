"""The metric conventions of a report (:class:`Settings`) and the flags that set them."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

import cwsa_jax as cw
from cwsa_jax.cli._util import UserError

# The deployment threshold the reports state: the largest CWSA on the grid among the thresholds
# that keep at least ``Settings.min_coverage`` of the samples (the commands' ``--min-coverage``).
SELECTION_METRIC = "cwsa"
DEFAULT_MIN_COVERAGE = 0.8
# Which CWSA the choice maximises: always divided by |S|, also where the reported CWSA is
# divided by n (--normalize all, --published-code). Every text stating the choice says so.
SELECTION_CWSA = "CWSA (divided by |S|, the paper's)"


@dataclasses.dataclass(frozen=True)
class Settings:
  """Metric conventions (defaults: the library's; see ``evaluate --help``)."""
  thresholds: tuple[float, ...] = tuple(float(t) for t in cw.default_thresholds())
  num_bins: int = 15
  binning: str = "width"
  ece_norm: str = "l1"
  aurc_convention: str = "step"
  normalize: str = "retained"
  aumcc_axis: str = "coverage"
  min_coverage: float = DEFAULT_MIN_COVERAGE

  @property
  def grid(self) -> np.ndarray:
    """The thresholds as a float32 [T] array."""
    return np.asarray(self.thresholds, np.float32)


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
  parser.add_argument("--min-coverage", type=float, default=DEFAULT_MIN_COVERAGE,
                      metavar="FRACTION",
                      help="the deployment threshold stated in the report is the one with the "
                      "largest CWSA divided by |S| (the paper's definition, whatever the "
                      "normalisation of the reported CWSA) among those keeping at least this "
                      f"coverage (default {DEFAULT_MIN_COVERAGE:g})")


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
      if stop < start:
        raise UserError(f"--thresholds {spec!r}: STOP {stop:g} is below START {start:g} "
                        "(START:STOP:STEP counts up from START to STOP)")
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
    bad = values[~((values >= 0) & (values < 1))]
    given = ", ".join(f"{x:g}" for x in bad[:4])
    if bad.size > 4:
      given += f" and {bad.size - 4} more"
    raise UserError(f"--thresholds {spec!r}: thresholds must lie in [0, 1), got {given}")
  return np.unique(values.astype(np.float32))
