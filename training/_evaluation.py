"""The evaluation of a trained model: the metrics.json fields of its validation and test logits.

:func:`evaluate_run` is what ``train_and_evaluate`` calls once training ends:

1. the validation and test splits with the hard metrics (CWSA/CWSA+ sweep,
   ECE, NLL, AURC, E-AURC, AUGRC: :func:`evaluate_logits`);
2. the softmax temperature fitted on the validation logits
   (:func:`cwsa_jax.fit_temperature`) and the test split again with the
   scaled logits;
3. the deployment threshold chosen on the temperature-scaled validation
   confidences (:func:`select_deployment_threshold`), with its coverage and
   selective risk on the validation and the test split;
4. the test predictions scored with each confidence score of :data:`SCORES`,
   before and after scaling (:func:`score_metrics`).

Everything here is a function of logits, labels and the config: no model, no
optimizer, no devices, so a run's ``predictions.npz`` can be evaluated again
without training. The sweep, accuracy and ECE accumulate batch by batch in an
``nnx.MultiMetric`` (:func:`make_evaluation_metrics`) whose exact sums equal one
pass over all the predictions; AURC, E-AURC and AUGRC need every confidence in
order and are computed once from the predictions.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import cwsa_jax as cw
from cwsa_jax.nnx import CalibrationMetric, SweepMetric
from .configs import TrainConfig

AT_THRESHOLDS = (0.5, 0.9)  # the thresholds metrics.json reports one by one
ECE_BINS = 15
# The confidence scores metrics.json reports rank metrics for (cwsa_jax.confidence_scores).
SCORES = ("msp", "max_logit", "margin", "neg_entropy", "doctor")
# Those of them that lie in [0, 1]: the others (real-valued) have rank metrics only; CWSA
# depends on the scale of a confidence.
UNIT_INTERVAL_SCORES = ("msp", "margin", "doctor")


def make_evaluation_metrics(thresholds) -> nnx.MultiMetric:
  """The evaluation metrics, updated batch by batch with ``confidences=`` and ``correct=``."""
  return nnx.MultiMetric(accuracy=nnx.metrics.Average("correct"), sweep=SweepMetric(thresholds),
                         at_threshold=SweepMetric(AT_THRESHOLDS),
                         calibration=CalibrationMetric(ECE_BINS))


@nnx.jit
def _update_evaluation(metrics: nnx.MultiMetric, probs: jax.Array, labels: jax.Array) -> None:
  confidences, correct = cw.confidences_from_probs(probs, labels)
  metrics.update(confidences=confidences, correct=correct)


def evaluate_predictions(probs: np.ndarray, labels: np.ndarray,
                         computed: dict[str, Any]) -> dict[str, Any]:
  """Hard-metric summary of test predictions (the metrics.json body).

  ``computed`` is ``make_evaluation_metrics(...).compute()`` after every test batch;
  AURC, E-AURC and AUGRC (exact, sort-based) come from ``probs`` and ``labels``.
  """
  conf, correct = cw.confidences_from_probs(probs, labels)
  r, at_r = computed["sweep"], computed["at_threshold"]
  at = {str(tau): {field: float(getattr(at_r, field)[j])
                   for field in ("cwsa", "cwsa_plus", "coverage", "selective_accuracy")}
        for j, tau in enumerate(AT_THRESHOLDS)}
  return {
      "n": int(len(labels)),
      "test_accuracy": float(computed["accuracy"]),
      "ece": float(computed["calibration"]),
      "aurc": float(cw.aurc(conf, correct)),
      "eaurc": float(cw.eaurc(conf, correct)),
      "augrc": float(cw.augrc(conf, correct)),
      "cwsa": {k: v["cwsa"] for k, v in at.items()},
      "cwsa_plus": {k: v["cwsa_plus"] for k, v in at.items()},
      "at_threshold": at,
      "sweep": {"thresholds": _as_list(r.thresholds), "coverage": _as_list(r.coverage),
                "selective_accuracy": _as_list(r.selective_accuracy), "cwsa": _as_list(r.cwsa),
                "cwsa_plus": _as_list(r.cwsa_plus)},
  }


def _as_list(x) -> list[float | None]:
  return [None if not np.isfinite(v) else float(v) for v in np.asarray(x)]


@jax.jit
def _softmax(logits: jax.Array) -> jax.Array:
  return jax.nn.softmax(logits, axis=-1)


def evaluate_logits(logits: np.ndarray, labels: np.ndarray,
                    config: TrainConfig) -> tuple[dict[str, Any], np.ndarray]:
  """(:func:`evaluate_predictions` summary plus ``nll``, probabilities) of logits [N, K]."""
  probs = np.asarray(_softmax(jnp.asarray(logits)))
  metrics = make_evaluation_metrics(config.thresholds)
  for i in range(0, len(labels), config.eval_batch_size):
    _update_evaluation(metrics, jnp.asarray(probs[i:i + config.eval_batch_size]),
                       jnp.asarray(labels[i:i + config.eval_batch_size]))
  summary = evaluate_predictions(probs, labels, metrics.compute())
  summary["nll"] = float(cw.nll(logits, labels, from_logits=True))
  return summary, probs


def score_metrics(logits: np.ndarray, labels: np.ndarray) -> dict[str, dict[str, Any]]:
  """AURC, E-AURC, AUGRC (and CWSA, CWSA+ at 0.5 and 0.9) of each score of :data:`SCORES`.

  The rank metrics take the real-valued scores (``max_logit``, ``neg_entropy``)
  as they are: only their order counts. Those have no CWSA (``null``): CWSA
  depends on the scale of a confidence.
  """
  correct = np.argmax(logits, axis=-1) == labels
  out = {}
  for method in SCORES:
    scores = np.asarray(cw.confidence_scores(logits, method=method))
    in_unit = method in UNIT_INTERVAL_SCORES
    entry = {"aurc": float(cw.aurc(scores, correct)), "eaurc": float(cw.eaurc(scores, correct)),
             "augrc": float(cw.augrc(scores, correct)), "cwsa": None, "cwsa_plus": None}
    if in_unit:
      r = cw.sweep(scores, correct, np.asarray(AT_THRESHOLDS, np.float32))
      entry["cwsa"] = {str(t): float(r.cwsa[j]) for j, t in enumerate(AT_THRESHOLDS)}
      entry["cwsa_plus"] = {str(t): float(r.cwsa_plus[j]) for j, t in enumerate(AT_THRESHOLDS)}
    out[method] = entry
  return out


def select_deployment_threshold(validation_probs: np.ndarray, validation_labels: np.ndarray,
                                test_probs: np.ndarray, test_labels: np.ndarray,
                                config: TrainConfig) -> dict[str, Any]:
  """The threshold chosen on validation confidences, with its operating point on both splits.

  :func:`cwsa_jax.select_threshold` over ``config.thresholds`` maximises
  ``config.threshold_metric`` under the optional coverage and risk
  constraints; the chosen float32 grid value is then applied to the test
  confidences. When no threshold meets the constraints, ``threshold`` is
  ``null`` and ``reason`` says why (the run is not lost).
  """
  out = {"score": "msp", "metric": config.threshold_metric,
         "min_coverage": config.threshold_min_coverage, "max_risk": config.threshold_max_risk}
  val_conf, val_correct = cw.confidences_from_probs(validation_probs, validation_labels)
  try:
    choice = cw.select_threshold(val_conf, val_correct, metric=config.threshold_metric,
                                 min_coverage=config.threshold_min_coverage,
                                 max_risk=config.threshold_max_risk,
                                 thresholds=np.asarray(config.thresholds, np.float32))
  except ValueError as e:  # no threshold of the grid meets the constraints
    return {**out, "threshold": None, "reason": str(e), "validation": None, "test": None}
  test_conf, test_correct = cw.confidences_from_probs(test_probs, test_labels)
  r = cw.sweep(test_conf, test_correct, np.asarray([choice.threshold], np.float32))
  accuracy = float(r.selective_accuracy[0])
  return {**out, "threshold": choice.threshold,
          "validation": {"coverage": choice.coverage, "selective_risk": choice.selective_risk,
                         config.threshold_metric: choice.value},
          "test": {"coverage": float(r.coverage[0]),
                   "selective_risk": None if not np.isfinite(accuracy) else 1.0 - accuracy,
                   "cwsa": _finite_or_none(r.cwsa[0]), "cwsa_plus": _finite_or_none(r.cwsa_plus[0])}}


def _finite_or_none(x) -> float | None:
  x = float(x)
  return x if np.isfinite(x) else None


def evaluate_run(validation_logits: np.ndarray, validation_labels: np.ndarray,
                 test_logits: np.ndarray, test_labels: np.ndarray,
                 config: TrainConfig) -> tuple[dict[str, Any], np.ndarray, float]:
  """(metrics.json evaluation fields, test probabilities, temperature) of a trained model.

  The top-level fields are the test metrics of the raw logits;
  ``temperature_scaled`` the same after dividing the logits by the temperature
  fitted on the validation split; ``validation`` the validation metrics (and
  its NLL, ECE, CWSA after scaling); ``selected_threshold`` the deployment
  threshold (:func:`select_deployment_threshold`, on scaled confidences);
  ``scores`` and ``scores_temperature_scaled`` the per-score metrics
  (:func:`score_metrics`) of the test split.
  """
  temperature = float(cw.fit_temperature(validation_logits, validation_labels))
  scale = lambda logits: (logits / np.float32(temperature)).astype(np.float32)
  test, test_probs = evaluate_logits(test_logits, test_labels, config)
  scaled, scaled_probs = evaluate_logits(scale(test_logits), test_labels, config)
  validation, _ = evaluate_logits(validation_logits, validation_labels, config)
  validation_scaled, validation_scaled_probs = evaluate_logits(scale(validation_logits),
                                                               validation_labels, config)
  validation["accuracy"] = validation.pop("test_accuracy")
  validation["temperature_scaled"] = {k: validation_scaled[k]
                                      for k in ("nll", "ece", "cwsa", "cwsa_plus")}
  metrics = {
      **test,
      "temperature": temperature,
      "temperature_scaled": scaled,
      "validation": validation,
      "selected_threshold": select_deployment_threshold(
          validation_scaled_probs, validation_labels, scaled_probs, test_labels, config),
      "scores": score_metrics(test_logits, test_labels),
      "scores_temperature_scaled": score_metrics(scale(test_logits), test_labels),
  }
  return metrics, test_probs, temperature
