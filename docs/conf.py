"""Sphinx configuration for the cwsa-jax documentation (``./dev.sh docs``).

Built with ``-W`` (warnings are errors) by ``./dev.sh docs`` and by
``tests/test_docs.py``. The notebooks in ``notebooks/`` are rendered with their
stored outputs, never executed; they are copied into ``_generated/`` (ignored
by git) because Sphinx reads sources only below this folder.
"""

from __future__ import annotations

import pathlib
import shutil
import sys

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # the checkout's cwsa_jax (and training/, for the CLI) first
sys.path.insert(0, str(DOCS / "_ext"))

import cwsa_jax  # noqa: E402

project = "cwsa-jax"
author = "cwsa-jax contributors"
copyright = "cwsa-jax contributors"
release = version = cwsa_jax.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "cli_help",  # _ext/cli_help.py: the CLI page from cwsa_jax.cli.build_parser
    "myst_nb",
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]
templates_path = ["_templates"]

# Docstrings are Google style with ``.. math::`` blocks; types live in the prose.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # "Attributes:" as a field list, not a second set of entries
napoleon_attr_annotations = False
# The docstrings give shapes and dtypes in prose; the annotations (mostly Any
# and jax.Array) would only add noise.
autodoc_typehints = "none"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_preserve_defaults = True
autosummary_generate = True
add_module_names = False
nitpicky = False
# Docstrings write the size of the retained set as |S|, which reStructuredText
# reads as a substitution: define it as itself.
rst_prolog = r"""
.. |S| replace:: \|S\|
"""


def _skip_namedtuple_field(app, what, name, obj, skip, options):
  """Hide NamedTuple fields ("Alias for field number 0"); the class docstring describes them."""
  if (getattr(obj, "__doc__", None) or "").startswith("Alias for field number"):
    return True
  return None


def setup(app):
  app.connect("autodoc-skip-member", _skip_namedtuple_field)


# Notebooks: rendered from their stored outputs, never executed.
nb_execution_mode = "off"
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = f"cwsa-jax {release}"

# Copy the notebooks next to the pages (only when they changed, so incremental
# builds stay incremental).
_NOTEBOOKS = DOCS / "_generated" / "notebooks"
_NOTEBOOKS.mkdir(parents=True, exist_ok=True)
_sources = {path.name: path for path in (ROOT / "notebooks").glob("*.ipynb")}
for _stale in _NOTEBOOKS.glob("*.ipynb"):
  if _stale.name not in _sources:
    _stale.unlink()
for _name, _source in sorted(_sources.items()):
  _target = _NOTEBOOKS / _name
  if not _target.exists() or _target.read_bytes() != _source.read_bytes():
    shutil.copyfile(_source, _target)
