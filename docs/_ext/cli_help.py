"""``.. cli-help:: module:function``: the ``--help`` of a parser and of each subcommand.

The function returns an ``argparse.ArgumentParser``; the directive renders its
``--help`` and, for each subcommand, a section with that subcommand's
``--help``, exactly as a terminal shows it (80 columns). The page is built from
the parser itself, so it cannot drift from the command line.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import textwrap
from unittest import mock

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

_COLUMNS = "80"


def _help(parser: argparse.ArgumentParser) -> str:
  with mock.patch.dict(os.environ, {"COLUMNS": _COLUMNS}):
    return parser.format_help()


def _subcommands(parser: argparse.ArgumentParser):
  """(name, one-line help, parser) for each subcommand, in registration order."""
  for action in parser._actions:  # argparse keeps no public list of subparsers
    if isinstance(action, argparse._SubParsersAction):
      helps = {choice.dest: choice.help for choice in action._choices_actions}
      for name, subparser in action.choices.items():
        yield name, helps.get(name) or "", subparser


def _literal(text: str) -> list[str]:
  return [".. code-block:: text", ""] + textwrap.indent(text.rstrip(), "   ").splitlines() + [""]


class CliHelp(SphinxDirective):
  required_arguments = 1
  has_content = False

  def run(self) -> list[nodes.Node]:
    module_name, _, function_name = self.arguments[0].partition(":")
    parser = getattr(importlib.import_module(module_name), function_name)()
    # Rebuild this page when the parser or a subcommand's module changes.
    for name, module in list(sys.modules.items()):
      if name.startswith(("cwsa_jax", "training")) and getattr(module, "__file__", None):
        self.env.note_dependency(module.__file__)
    lines = _literal(_help(parser))
    for name, summary, subparser in _subcommands(parser):
      title = f"``{subparser.prog}``"
      lines += [title, "-" * len(title), ""]
      if summary:
        lines += [summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else "."), ""]
      lines += _literal(_help(subparser))
    container = nodes.section()
    nested_parse_with_titles(self.state, StringList(lines, source=self.get_source_info()[0]), container)
    return container.children


def setup(app):
  app.add_directive("cli-help", CliHelp)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
