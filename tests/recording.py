"""``Recording``: a ``_dispatch.Kernels`` that records which forms it picked (for tests)."""

from __future__ import annotations

import dataclasses

from cwsa_jax._kernels import _dispatch


@dataclasses.dataclass(frozen=True)
class Recording(_dispatch.Kernels):
  """Kernels that record the choices they make: ``(site, form)`` of each form :meth:`pick`
  traced (``lax.platform_dependent`` traces them all; a forced platform only its own), and
  ``(array, answer)`` of :meth:`on_accelerator`. Each instance equals no other (``token``), so
  the jitted internals trace it anew and every choice is recorded."""

  picked: list = dataclasses.field(default_factory=list, compare=False, repr=False)
  asked: list = dataclasses.field(default_factory=list, compare=False, repr=False)
  token: object = dataclasses.field(default_factory=object, repr=False)

  def pick(self, site, *args, **forms):
    def traced(name, form):
      def run(*a):
        self.picked.append((site, name))
        return form(*a)
      return run

    forms = {name: None if f is None else traced(name, f) for name, f in forms.items()}
    return super().pick(site, *args, **forms)

  def forms(self, site) -> set:
    """The forms of ``site`` that were traced."""
    return {name for s, name in self.picked if s == site}

  def on_accelerator(self, x):
    answer = super().on_accelerator(x)
    self.asked.append((x, answer))
    return answer

  def times_asked(self, x) -> int:
    """How often ``on_accelerator`` was asked about ``x`` (every answer True, as forced)."""
    answers = [a for y, a in self.asked if y is x]
    assert all(answers), answers
    return len(answers)
