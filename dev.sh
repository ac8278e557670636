#!/usr/bin/env bash
# The README's two commands:
#   ./dev.sh demo   set up .venv with cwsa-jax[plots] and run the main job (synthetic demo, no data)
#   ./dev.sh test   set up .venv with cwsa-jax[dev] and run the test suite (CI, CWSA_JAX_SLOW=1: and
#                   the cases marked slow or interpreted)
#   ./dev.sh docs   set up .venv with cwsa-jax[dev] and build the documentation into docs/_build/html
# Extra arguments are passed on (to `cwsa-jax demo`, to pytest or to sphinx-build).
set -euo pipefail
cd "$(dirname "$0")"
venv="${CWSA_JAX_VENV:-.venv}"
python="${PYTHON:-python3}"

# setup EXTRA: install cwsa-jax[EXTRA] into the venv unless an install of pyproject.toml as it is
# now already covers it ([dev] includes [plots]).
setup() {
  local extra="$1"
  if [ ! -x "$venv/bin/python" ]; then
    echo "[dev.sh] creating $venv" >&2
    "$python" -m venv "$venv"
  fi
  local want
  want=$(sha256sum pyproject.toml | cut -d' ' -f1)
  local stamp
  for stamp in "$venv/.cwsa-jax-installed-$extra" "$venv/.cwsa-jax-installed-dev"; do
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
      return
    fi
  done
  echo "[dev.sh] installing cwsa-jax[$extra] into $venv" >&2
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -e ".[$extra]"
  echo "$want" > "$venv/.cwsa-jax-installed-$extra"
}

cmd="${1:-}"
shift || true
case "$cmd" in
  demo)
    setup plots
    exec "$venv/bin/cwsa-jax" demo "$@"
    ;;
  test)
    setup dev
    # Local copies of MNIST / CIFAR-10 for the data tests, when present beside the checkout.
    if [ -z "${CWSA_JAX_DATA_DIR:-}" ] && [ -d ../shared/data ]; then
      export CWSA_JAX_DATA_DIR="$(cd ../shared/data && pwd)"
    fi
    # A persistent JAX compilation cache: a contributor's next run compiles only the programs a
    # change touched (compiling is most of the suite's time). Kept between runs in the user's
    # cache folder, at most 2 GiB (least recently used entries go first); remove the folder to
    # start cold. CI starts cold, with a cache of its own for the run (shared by both workers
    # and the commands the tests start), removed at the end. A cache directory set by the
    # caller is used as it is and kept.
    if [ -z "${JAX_COMPILATION_CACHE_DIR:-}" ]; then
      if [ -n "${CI:-}" ]; then
        JAX_COMPILATION_CACHE_DIR="$(mktemp -d "${TMPDIR:-/tmp}/cwsa-jax-test-cache.XXXXXX")"
        trap 'rm -rf "$JAX_COMPILATION_CACHE_DIR"' EXIT
      else
        JAX_COMPILATION_CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/cwsa-jax/test-compilation-cache"
        mkdir -p "$JAX_COMPILATION_CACHE_DIR"
        export JAX_COMPILATION_CACHE_MAX_SIZE="${JAX_COMPILATION_CACHE_MAX_SIZE:-2147483648}"
      fi
      export JAX_COMPILATION_CACHE_DIR
    fi
    export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="${JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS:-0}"
    # loadfile: each test file runs on one worker, so its module fixtures are built once and
    # the programs its tests share compile once (per test, both workers would compile them).
    # A crashed worker ends the run (failed) instead of being replaced: a replacement under
    # loadgroup was seen to wait forever for work.
    # --durations=15: every run ends with its slowest tests, so a slow new test shows at once.
    pytest=("$venv/bin/python" -m pytest -n 2 --dist loadfile --max-worker-restart 0 --durations=15)
    if [ "$#" -gt 0 ]; then  # the caller chooses the tests (and markers)
      "${pytest[@]}" "$@"
      exit
    fi
    # XLA flags that make compiling (most of the suite's time) cheaper: unoptimized CPU code
    # generation, same IEEE arithmetic, but not always the same rounding as another program of the
    # same math. So the cases marked xla_defaults (bit equality of two programs), slow or
    # interpreted run with XLA's defaults, and CI covers both. Skipped if this jaxlib refuses them.
    fast_flags="--xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=0"
    fast_flags+=" --xla_llvm_disable_expensive_passes=true"
    quick=(env)
    if XLA_FLAGS="${XLA_FLAGS:-} $fast_flags" "$venv/bin/python" -c \
        'import jax.numpy as jnp; jnp.zeros(2).block_until_ready()' >/dev/null 2>&1; then
      quick=(env XLA_FLAGS="${XLA_FLAGS:-} $fast_flags")
    else
      echo "[dev.sh] this jaxlib refuses the compile-time flags; the quick checks run with XLA's defaults" >&2
    fi
    # The suite, without the end-to-end cases marked slow (whole commands, kills, installs,
    # notebooks, benchmark smoke runs) and the accelerator kernels run through the Pallas
    # interpreter (marked interpreted); CI, or CWSA_JAX_SLOW=1, runs those next.
    "${quick[@]}" "${pytest[@]}" -m "not slow and not interpreted and not xla_defaults"
    if [ -n "${CI:-}" ] || [ "${CWSA_JAX_SLOW:-0}" = 1 ]; then
      echo "[dev.sh] the cases marked xla_defaults, slow or interpreted" >&2
      "${pytest[@]}" -m "xla_defaults or slow or interpreted"
    else
      echo "[dev.sh] the cases marked xla_defaults" >&2
      "${pytest[@]}" -m "xla_defaults and not slow and not interpreted"
    fi
    ;;
  docs)
    setup dev
    # The documentation site, warnings as errors (tests/test_docs.py runs the same build in CI).
    exec "$venv/bin/python" -m sphinx -W --keep-going -b html "$@" docs docs/_build/html
    ;;
  *)
    echo "usage: ./dev.sh demo [args] | ./dev.sh test [pytest args] | ./dev.sh docs [sphinx-build args]" >&2
    exit 2
    ;;
esac
