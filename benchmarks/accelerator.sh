#!/usr/bin/env bash
# Every cwsa-jax benchmark on a GPU in under 8 minutes; writes results/benchmarks/gpu.json and
# results/benchmarks/gpu_choices.json.
#
#   benchmarks/accelerator.sh            # on a GPU machine: n up to 1e8, checks, bandwidth, sort ratio
#   benchmarks/accelerator.sh --quick    # small n: runs on a CPU too (tests the script)
#   (other arguments go to benchmarks/accelerator.py: --sizes, --only, --out, --deadline-s, ...)
#
# Installs nothing. It needs a Python with numpy and a GPU build of jax:
#   pip install -e . "jax[cuda12]"        (or "jax[cuda13]", matching the driver)
# The lent H100/H200 machines' python3 already has jax with the CUDA 13 plugin, and cwsa_jax is
# imported from this checkout (the repository root goes on PYTHONPATH), so nothing else is needed
# there. $PYTHON picks the interpreter; otherwise the first of .venv/bin/python and python3 whose
# jax sees a GPU (with --quick: whose jax imports).
# First (not with --quick) benchmarks/gpu_choices.py times the GPU forms against the forms they
# replace and the dense kernel's launches (results/benchmarks/gpu_choices.json, $CHOICES_OUT);
# accelerator.py then runs with the fastest launch it found (--launch; only a file this run wrote).
# accelerator.py stops starting cases after 280 s (--deadline-s), ends the run when one case hangs
# for 90 s (--case-limit-s), and rewrites its JSON after every row; the timeouts
# below (140 s, then 320 s) keep the whole run under 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
for arg in "$@"; do [ "$arg" = "--quick" ] && quick=1; done

has_gpu_jax() { "$1" -c 'import sys, jax; sys.exit(jax.default_backend() == "cpu")' >/dev/null 2>&1; }
has_jax() { "$1" -c 'import jax, numpy' >/dev/null 2>&1; }

python="${PYTHON:-}"
if [ -z "$python" ]; then
  for candidate in .venv/bin/python python3; do
    command -v "$candidate" >/dev/null 2>&1 || [ -x "$candidate" ] || continue
    if has_gpu_jax "$candidate" || { [ "$quick" = 1 ] && has_jax "$candidate"; }; then
      python="$candidate"
      break
    fi
  done
fi
if [ -z "$python" ]; then
  echo "accelerator.sh: no Python whose jax sees a GPU; install one (pip install -e . 'jax[cuda12]')," \
       "set PYTHON, or pass --quick to run on a CPU" >&2
  exit 2
fi

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
echo "accelerator.sh: $python ($("$python" -c 'import jax; print(jax.__version__, jax.default_backend())'))" >&2
status=0
launch=()
if [ "$quick" = 0 ]; then
  choices="${CHOICES_OUT:-results/benchmarks/gpu_choices.json}"
  stamp="$(mktemp)"
  timeout 140 "$python" benchmarks/gpu_choices.py --deadline-s 90 --out "$choices" >/dev/null \
    || status=$?
  # Only launches measured by this run: a stale file (gpu_choices.py failed before writing) is not used.
  if [ "$choices" -nt "$stamp" ]; then
    launch=(--launch "$choices")
  else
    echo "accelerator.sh: gpu_choices.py wrote no $choices (status $status); default launches" >&2
  fi
  rm -f "$stamp"
fi
timeout 320 "$python" benchmarks/accelerator.py ${launch[@]+"${launch[@]}"} "$@" || status=$?
exit "$status"
