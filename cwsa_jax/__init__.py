"""cwsa-jax: confidence-weighted selective accuracy (CWSA, CWSA+) and friends in JAX.

Hard metrics at one threshold (:func:`cwsa`, :func:`cwsa_plus`, :func:`coverage`,
:func:`selective_accuracy`), the fused all-thresholds :func:`sweep`, and helpers
that turn probabilities or logits into (confidences, correct).
"""

from cwsa_jax._confidence import Predictions
from cwsa_jax._confidence import confidences_from_logits
from cwsa_jax._confidence import confidences_from_probs
from cwsa_jax._selective import coverage
from cwsa_jax._selective import cwsa
from cwsa_jax._selective import cwsa_plus
from cwsa_jax._selective import selective_accuracy
from cwsa_jax._sweep import SweepResult
from cwsa_jax._sweep import sweep

__version__ = "0.1.0"

__all__ = [
    "Predictions",
    "SweepResult",
    "confidences_from_logits",
    "confidences_from_probs",
    "coverage",
    "cwsa",
    "cwsa_plus",
    "selective_accuracy",
    "sweep",
]
