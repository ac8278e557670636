"""cwsa-jax: confidence-weighted selective accuracy (CWSA, CWSA+) and friends in JAX.

Hard metrics at one threshold (:func:`cwsa`, :func:`cwsa_plus`, :func:`coverage`,
:func:`selective_accuracy`), the fused all-thresholds :func:`sweep`, helpers
that turn probabilities or logits into (confidences, correct), and the classic
references with named conventions: ECE family (smooth and classwise ECE
included), Brier score, NLL, the risk-coverage curve, AURC, E-AURC, AUGRC and
AUMCC, and the failure-detection AUROC, FPR@TPR and average precision; sigmoid-relaxed soft
CWSA/CWSA+ (and ``cwsa_jax.losses`` for training), per-sample contributions,
per-group sweeps and threshold selection; bootstrap confidence intervals
(:func:`bootstrap_ci`, :func:`bootstrap_sweep`, :func:`paired_bootstrap`) and,
in ``cwsa_jax.streaming``, exact mergeable metric states for batched and
multi-device evaluation.

References:
  Kourosh Shahnazari, Seyed Moein Ayyoubzadeh, Mohammadali Keshtparvar and
  Pegah Ghaffari, "Trust, or Don't Predict: Introducing the CWSA Family for
  Confidence-Aware Model Evaluation", arXiv:2505.18622 (2025),
  https://arxiv.org/abs/2505.18622.
"""

from cwsa_jax._aumcc import aumcc
from cwsa_jax._bootstrap import BootstrapResult
from cwsa_jax._bootstrap import PairedBootstrapResult
from cwsa_jax._bootstrap import bootstrap_ci
from cwsa_jax._bootstrap import bootstrap_samples
from cwsa_jax._bootstrap import bootstrap_sweep
from cwsa_jax._bootstrap import paired_bootstrap
from cwsa_jax._calibration import CalibrationBins
from cwsa_jax._calibration import calibration_bins
from cwsa_jax._calibration import ece
from cwsa_jax._classwise_ece import classwise_ece
from cwsa_jax._confidence import Predictions
from cwsa_jax._confidence import confidences_from_logits
from cwsa_jax._confidence import confidences_from_probs
from cwsa_jax._decompose import Contributions
from cwsa_jax._decompose import contributions
from cwsa_jax._decompose import most_damaging
from cwsa_jax._groups import group_gap
from cwsa_jax._groups import sweep_by_group
from cwsa_jax._ranking import auroc
from cwsa_jax._ranking import average_precision
from cwsa_jax._ranking import fpr_at_tpr
from cwsa_jax._risk_coverage import RiskCoverageCurve
from cwsa_jax._risk_coverage import RiskCoverageSummary
from cwsa_jax._risk_coverage import aurc
from cwsa_jax._risk_coverage import augrc
from cwsa_jax._risk_coverage import coverage_at_risk
from cwsa_jax._risk_coverage import eaurc
from cwsa_jax._risk_coverage import risk_at_coverage
from cwsa_jax._risk_coverage import risk_coverage_curve
from cwsa_jax._risk_coverage import risk_coverage_summary
from cwsa_jax._scoring import brier_score
from cwsa_jax._scoring import nll
from cwsa_jax._scores import confidence_scores
from cwsa_jax._select import ThresholdChoice
from cwsa_jax._select import select_threshold
from cwsa_jax._selective import coverage
from cwsa_jax._selective import cwsa
from cwsa_jax._selective import cwsa_plus
from cwsa_jax._selective import selective_accuracy
from cwsa_jax._smooth_ece import smooth_ece
from cwsa_jax._soft import soft_cwsa
from cwsa_jax._soft import soft_cwsa_band_area
from cwsa_jax._soft import soft_cwsa_plus
from cwsa_jax._soft import soft_cwsa_sweep
from cwsa_jax._sweep import SweepResult
from cwsa_jax._sweep import default_thresholds
from cwsa_jax._sweep import published_thresholds
from cwsa_jax._sweep import sweep
from cwsa_jax._temperature import fit_temperature

__version__ = "0.1.0"

__all__ = [
    "BootstrapResult",
    "CalibrationBins",
    "Contributions",
    "PairedBootstrapResult",
    "Predictions",
    "RiskCoverageCurve",
    "RiskCoverageSummary",
    "SweepResult",
    "ThresholdChoice",
    "aumcc",
    "augrc",
    "aurc",
    "auroc",
    "average_precision",
    "bootstrap_ci",
    "bootstrap_samples",
    "bootstrap_sweep",
    "brier_score",
    "calibration_bins",
    "classwise_ece",
    "confidences_from_logits",
    "confidence_scores",
    "confidences_from_probs",
    "contributions",
    "coverage",
    "coverage_at_risk",
    "cwsa",
    "cwsa_plus",
    "eaurc",
    "ece",
    "fit_temperature",
    "fpr_at_tpr",
    "group_gap",
    "most_damaging",
    "nll",
    "paired_bootstrap",
    "risk_at_coverage",
    "risk_coverage_curve",
    "risk_coverage_summary",
    "select_threshold",
    "selective_accuracy",
    "smooth_ece",
    "soft_cwsa",
    "soft_cwsa_band_area",
    "soft_cwsa_plus",
    "soft_cwsa_sweep",
    "sweep",
    "sweep_by_group",
    "default_thresholds",
    "published_thresholds",
]
