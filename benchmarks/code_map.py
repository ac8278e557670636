"""The library's shape, computed from its code: modules, their sizes, import arrows, cycles.

``python benchmarks/code_map.py`` prints JSON: every module of ``cwsa_jax`` (and
``training``) with its line count, the imports between them (function-level imports
included), the modules over ``--max-lines`` lines and every import cycle.
"""

from __future__ import annotations

import argparse
import ast
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = {"cwsa_jax": ROOT / "cwsa_jax", "cwsa_jax.training": ROOT / "training"}


def modules() -> dict[str, pathlib.Path]:
  """Dotted name -> file, for every module of the packages."""
  found = {}
  for package, folder in PACKAGES.items():
    for path in sorted(folder.rglob("*.py")):
      parts = list(path.relative_to(folder).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts = parts[:-1]
      found[".".join([package, *parts])] = path
  return found


def imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
  """The known modules that ``name`` imports anywhere in its file."""
  package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
  targets = set()
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, ast.Import):
      targets.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = package.split(".")
        anchor = anchor[:len(anchor) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
      targets.add(base)
      targets.update(f"{base}.{alias.name}" for alias in node.names)
  targets = {t.replace("training.", "cwsa_jax.training.", 1) if t.startswith("training.") else t
             for t in targets}
  return {t for t in targets if t in known and t != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in graph[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        out.append(sorted(component))

  sys.setrecursionlimit(10_000)
  for v in graph:
    if v not in index:
      visit(v)
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--max-lines", type=int, default=800)
  args = parser.parse_args(argv)
  found = modules()
  # "from cwsa_jax import _x" names a module; "from cwsa_jax import sweep" does not.
  graph = {name: imports(name, path, set(found)) - {"cwsa_jax"} for name, path in found.items()}
  lines = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in found.items()}
  library = [m for m in found if not m.startswith("cwsa_jax.training")]
  print(json.dumps({
      "modules": len(found),
      "library_modules": len(library),
      "library_lines": sum(lines[m] for m in library),
      "import_arrows": sum(len(v) for v in graph.values()),
      "over_max_lines": {m: lines[m] for m in found if lines[m] > args.max_lines},
      "cycles": cycles(graph),
      "lines": lines,
      "imports": {m: sorted(v) for m, v in graph.items()},
  }, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
