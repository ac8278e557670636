"""The house rules that benchmarks/code_map.py computes from the code: no import cycle (function-level
imports included) and no library module over 800 lines."""

import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _code_map(capsys):
  spec = importlib.util.spec_from_file_location("code_map", ROOT / "benchmarks" / "code_map.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  assert module.main([]) == 0
  return json.loads(capsys.readouterr().out)


def test_no_import_cycle_and_no_module_over_800_lines(capsys):
  found = _code_map(capsys)
  assert found["library_modules"] > 50  # the walk found the library
  assert found["cycles"] == []
  assert found["over_max_lines"] == {}
