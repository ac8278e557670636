"""Which form of each kernel runs: one explicit configuration, passed as an argument.

Several kernels have a form per platform (a loop over cache-sized chunks on
the CPU, every chunk at once elsewhere; Pallas kernels on CUDA GPUs; NumPy's
sort on the CPU) and a few settings (chunk sizes, the Pallas launch of the
dense sums). :class:`Kernels` holds those choices and :meth:`Kernels.pick` is
the one place that picks a form per platform. The public functions run
:data:`DEFAULT` (each platform its own form, the measured settings); tests and
benchmarks pass another ``Kernels`` to the internal entry points, e.g.
``Kernels(platform="cuda", interpret=True)`` to run the CUDA forms on the CPU
through Pallas' interpreter. Nothing here is ever assigned at run time.

``Kernels`` is frozen and hashable: it is a static argument of the jitted
internals and a key of the cached ``custom_vmap`` kernels.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
from jax import lax

PLATFORMS = (None, "cpu", "cuda")

# At most 2^18 samples per chunk of the exact sums (``_exact.segment_sums``): 4096 times a
# chunk's length stays below 2^31, and a chunk's columns stay in the cache.
CHUNK_SIZE = 1 << 18

# The dense kernel's launch per mask height R (16, 32 or 64 rows): (form, samples per step,
# warps, software pipeline stages), the fastest exact launch ``benchmarks/gpu_choices.py``
# found on the latest GPU it ran on.
DENSE_LAUNCH = ((16, ("unrolled", 256, 4, 2)), (32, ("unrolled", 512, 4, 2)),
                (64, ("bits", 256, 4, 2)))

Launch = tuple  # (form, samples per step, warps, pipeline stages)


@dataclasses.dataclass(frozen=True)
class Kernels:
  """The kernel forms and settings a computation runs with (see the module docstring)."""

  platform: str | None = None
  """Whose forms run. None: each platform its own, picked by ``lax.platform_dependent`` when
  the computation is lowered. ``"cuda"``: the CUDA forms (or, where a choice has none, the
  accelerators' form) wherever we run, and concrete arrays are checked as if they lived on an
  accelerator; on the CPU the Pallas kernels then need :attr:`interpret`. ``"cpu"``: the CPU
  forms wherever we run."""

  interpret: bool = False
  """Run the Pallas kernels (``_dense``, ``_group_areas``) through Pallas' interpreter, so
  that their CUDA forms run on the CPU."""

  dense: bool = True
  """Offer ``_dense``'s kernel (few buckets, binary samples) on CUDA; False keeps the scatter
  path everywhere."""

  sorted_sums: bool = True
  """Offer ``_sorted_sums`` (many buckets: one sort, prefix sums) on CUDA; False keeps the
  scatter path."""

  group_areas: bool = True
  """Offer ``_group_areas``' kernel (the AURC family after the sort) on CUDA; False keeps the
  XLA scans."""

  starts_by_running_max: bool = True
  """The risk-coverage scans' parallel form (accelerators): each tie group's start and the
  errors before it by running maxima (True) or by a scatter and a gather (False, the graded
  losses' way); the values are the same."""

  select_by_sort: bool = True
  """Order statistics on CUDA by one ``lax.sort`` (True) or the radix select of every other
  platform (False); the values are the same."""

  dense_form: str | None = None
  """A form of ``_dense.FORMS`` for every mask height, in place of :attr:`dense_launch`'s."""

  dense_launch: tuple = DENSE_LAUNCH
  """``((height, (form, samples per step, warps, stages)), ...)``: the dense kernel's launch
  per mask height (a mapping is accepted too)."""

  chunk_size: int = CHUNK_SIZE
  """Most samples per chunk of the sweep family's exact sums (``_exact.segment_sums``)."""

  stable_by_radix: bool | None = None
  """How the CPU form of the stable sorts (``_sort.sort_with_order``,
  ``_sort.stable_flag_counts``) finds the order: True a two-pass radix sort of 16-bit digits,
  False NumPy's sort of 64-bit (key, position) words (the same order); None: the one this CPU
  runs faster (``_sort._RADIX_ORDER``)."""

  def __post_init__(self):
    if self.platform not in PLATFORMS:
      raise ValueError(f"platform must be one of {PLATFORMS}, got {self.platform!r}")
    if not 0 < self.chunk_size <= CHUNK_SIZE:
      raise ValueError(f"chunk_size must be in [1, 2^18] (exact int32 sums), got {self.chunk_size}")
    # Stored as nested tuples whatever was given: the instance stays hashable.
    launch = self.dense_launch
    items = launch.items() if isinstance(launch, Mapping) else launch
    object.__setattr__(self, "dense_launch",
                       tuple(sorted((int(h), tuple(v)) for h, v in items)))

  def pick(self, site: str, *args: Any, cpu: Callable | None = None,
           cuda: Callable | None = None, default: Callable) -> Any:
    """``form(*args)`` of the form for this platform: ``cpu``, ``cuda`` or ``default``.

    ``site`` names the choice (e.g. ``"dense"``, ``"exact"``): what a test's subclass that
    records its choices reads. With :attr:`platform` None the platform is the one the
    computation is lowered for; otherwise the forced one (``default`` where it has no form).
    """
    del site
    if self.platform is None:
      forms = {k: f for k, f in (("cpu", cpu), ("cuda", cuda)) if f is not None}
      return lax.platform_dependent(*args, **forms, default=default)
    form = {"cpu": cpu, "cuda": cuda}[self.platform]
    return (form or default)(*args)

  def on_accelerator(self, x: Any) -> bool:
    """Whether concrete ``x`` is treated as living on an accelerator (checked there)."""
    if self.platform is not None:
      return self.platform != "cpu"
    return isinstance(x, jax.Array) and any(d.platform != "cpu" for d in x.devices())

  def launch(self, height: int) -> Launch:
    """The dense kernel's ``(form, samples per step, warps, stages)`` for ``height`` mask rows."""
    form, block, warps, stages = dict(self.dense_launch)[height]
    return (self.dense_form or form, block, warps, stages)

  def with_launches(self, launches: Mapping[int, Sequence]) -> "Kernels":
    """These kernels with the dense launches of ``launches`` ({height: launch}) in place."""
    table = dict(self.dense_launch)
    table.update({int(h): tuple(v) for h, v in launches.items()})
    return dataclasses.replace(self, dense_launch=table)


# The kernels of the public functions: each platform its own form, the measured settings.
DEFAULT = Kernels()
