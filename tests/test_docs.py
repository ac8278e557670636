"""The documentation site builds with warnings as errors and covers the public API.

This is how CI builds the docs: ``./dev.sh test`` runs this test, ``./dev.sh docs``
runs the same build into docs/_build/html.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import cwsa_jax
from cwsa_jax import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
PUBLIC_MODULES = ("losses", "streaming", "synthetic", "plots")


def _anchors(html: str) -> set[str]:
  return set(re.findall(r'id="([^"]+)"', html))


def test_docs_build_without_warnings(tmp_path):
  out = tmp_path / "html"
  build = subprocess.run(
      [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-j", "1", "-q", "-b", "html",
       "-d", str(tmp_path / "doctrees"), str(ROOT / "docs"), str(out)],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert build.returncode == 0, f"sphinx-build failed:\n{build.stdout}\n{build.stderr}"

  # Every public name has its entry (an anchor) on the API page.
  api = (out / "api" / "cwsa_jax.html").read_text(encoding="utf-8")
  missing = [name for name in cwsa_jax.__all__ if f"cwsa_jax.{name}" not in _anchors(api)]
  assert not missing, f"add these names of cwsa_jax.__all__ to docs/api/cwsa_jax.rst: {missing}"

  # Each public module has its page, documenting its members.
  for module in PUBLIC_MODULES:
    page = (out / "_generated" / "api" / f"cwsa_jax.{module}.html").read_text(encoding="utf-8")
    assert any(a.startswith(f"cwsa_jax.{module}.") for a in _anchors(page)), module

  # The CLI page is the parser's own --help, one section per subcommand.
  cli_page = (out / "cli.html").read_text(encoding="utf-8")
  commands = [a for a in cli.build_parser()._actions if a.dest == "command"][0].choices
  for name in commands:
    assert f"usage: cwsa-jax {name} " in cli_page, name

  # Both notebooks are rendered from their stored outputs (figures included).
  for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
    page = (out / "_generated" / "notebooks" / f"{notebook.stem}.html").read_text(encoding="utf-8")
    assert "<img" in page, notebook.name
