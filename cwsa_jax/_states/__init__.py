"""The mergeable states behind :mod:`cwsa_jax.streaming`, one private module each.

``_common`` (batch checks, exact merges, configured classes), ``_sweep_state``
(:class:`~cwsa_jax.streaming.SweepState`), ``_calibration_state``
(:class:`~cwsa_jax.streaming.CalibrationState`), ``_risk_coverage_state``
(:class:`~cwsa_jax.streaming.RiskCoverageState` and its confidence-key layout) and
``_merge`` (:func:`~cwsa_jax.streaming.process_merge`). ``cwsa_jax.streaming``
re-exports the public names, whose ``__module__`` names it.
"""
