"""Bootstrap confidence intervals for any metric, and a paired bootstrap test.

Resample b (b = 0, ..., B - 1) draws n indices with replacement,
I_b = (i_{b1}, ..., i_{bn}) with i_{bj} uniform on {0, ..., n - 1}, and
evaluates the metric on the resampled data:

.. math::

  \\hat\\theta = f(c, \\kappa), \\qquad
  \\theta^*_b = f(c_{I_b}, \\kappa_{I_b}),

and the percentile interval at level 1 - alpha is
[Q_{alpha/2}, Q_{1 - alpha/2}] of the theta*_b.

``fn`` is ``jax.vmap``-ed over a chunk of at most ``chunk_size`` resamples and
the chunks run one after another (``jax.lax.map``), so the resampled data held
at once is ``chunk_size * n`` values, never ``B * n``; only the B metric values
are kept. The chunks run in blocks of about ``BLOCK_ELEMENTS`` resampled values,
one jitted call per block in a host loop (well under a second each at the
command line's sizes): Python sees a Ctrl-C only between calls into XLA, and
:func:`reporting` can show progress. Called under a transformation (``jit``,
``vmap``), everything is one call. The values do not depend on the blocks.

Random indices. Resample b uses the seed (s_0, s_1) = 64 random bits of
``jax.random.fold_in(key, b)``, so its indices depend on (key, b, n) only: not
on ``chunk_size`` or ``num_resamples`` (the first 100 resamples of a
1000-resample run are those of a 100-resample run). Index j of the
resample is

.. math::

  (w_0, w_1) = \\mathrm{Threefry2x32\\text{-}20}_{(s_0, s_1)}(0, j), \\qquad
  i_{bj} = \\left\\lfloor \\frac{(2^{32} w_0 + w_1)\\, n}{2^{64}} \\right\\rfloor,

where Threefry-2x32 with 20 rounds is the counter-based generator behind
``jax.random``'s default keys (Salmon et al., SC 2011), and the 64-bit
multiply-shift map (Lemire, 2019) gives every index probability 1/n to
within a relative n/2^64. Computing the bits here, unrolled, one Threefry
block per index, is cheaper on CPU than ``jax.random.randint`` (two blocks per
index, in a rolled loop); ``benchmarks/bench_bootstrap.py`` measures it.
``_sampler._resample_indices`` returns the indices, for tests.

The package, from the bottom up: ``_stand_ins`` (concrete scores mapped once on the host:
real-valued scores of the order metrics, float64 confidences finer than float32),
``_checks`` (argument checks), ``_sampler``
(the random indices and Poisson multiplicities above), ``_runner`` (the host
loop of jitted blocks and :func:`reporting`), ``_intervals`` (result types,
percentiles, p-values), ``_fast_forms`` (the metrics bucketed once), ``_api``
(:func:`bootstrap_samples`, :func:`bootstrap_ci`, :func:`paired_bootstrap`,
:func:`bootstrap_sweep`); the evaluation bootstrap of the command line:
``_bucket_sums`` (its one sort and exact bucket sums), ``_area_scan`` (AURC,
AUGRC, E-AURC from resampled multiplicities), ``_engine``
(:func:`bootstrap_evaluation`, :func:`paired_evaluation`) and ``_streamed``
(:class:`StreamedEvaluationBootstrap`). What this package exports below is its
internal surface (the command line's, beside the public names ``cwsa_jax``
re-exports); everything else is private to its module.
"""

from cwsa_jax._bootstrap._api import bootstrap_ci
from cwsa_jax._bootstrap._api import bootstrap_samples
from cwsa_jax._bootstrap._api import bootstrap_sweep
from cwsa_jax._bootstrap._api import paired_bootstrap
from cwsa_jax._bootstrap._engine import MAX_EVALUATION_N
from cwsa_jax._bootstrap._engine import RESAMPLING
from cwsa_jax._bootstrap._engine import EvaluationMetrics
from cwsa_jax._bootstrap._engine import bootstrap_evaluation
from cwsa_jax._bootstrap._engine import paired_evaluation
from cwsa_jax._bootstrap._intervals import BootstrapResult
from cwsa_jax._bootstrap._intervals import PairedBootstrapResult
from cwsa_jax._bootstrap._runner import reporting
from cwsa_jax._bootstrap._runner import run_blocks
from cwsa_jax._bootstrap._streamed import StreamedEvaluationBootstrap

__all__ = [
    "BootstrapResult",
    "EvaluationMetrics",
    "MAX_EVALUATION_N",
    "PairedBootstrapResult",
    "RESAMPLING",
    "StreamedEvaluationBootstrap",
    "bootstrap_ci",
    "bootstrap_evaluation",
    "bootstrap_samples",
    "bootstrap_sweep",
    "paired_bootstrap",
    "paired_evaluation",
    "reporting",
    "run_blocks",
]
