#!/usr/bin/env bash
# CI phase: the wheel from `make dist` as a user gets it, on the newest Python and dependencies.
#
# A fresh venv for PYTHON installs dist/*.whl with the extras testing, spark, avro, metrics and serve,
# and the `test` dependency group, at the NEWEST versions pyproject.toml allows (.venv keeps the
# lowest, constraints-ci.txt; .ci/constraints-newest.txt holds back only what CI cannot test), with
# no Rust toolchain on PATH (nothing may compile the native core). Then, from a scratch directory, so that the checkout is not on sys.path:
#   1. `materializer --version`, and the import root and native module come from site-packages;
#   2. `materializer demo` (the broker jars come from `make broker-jars`' cache);
#   3. the examples/test_harness tests, copied out as a user's own project;
#   4. the unit tests (but the mutation-fuzz and kill campaigns) and the integration tests that exercise the upper-bounded dependencies
#      (PySpark: the Spark jobs and worker daemon; kafka-python: its contract test, a unit test, while
#      only one release is allowed; rocksdict: the SST writer's tests are unit tests), with --import-mode=append: pytest puts the checkout AFTER site-packages,
#      so `tests.*` resolves to the checkout and `materializer` to the wheel
#      (tests/unit/materializer/test_installed_package.py fails otherwise).
# Each step prints its wall time. Usage: .ci/installed_wheel.sh PYTHON [VENV]   (VENV: .venv-wheel)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$PWD"
# the unit tests below include the tmpfs ones (tests/tmpfs.py): a mount that fails fails them here
export CI=true
python="${1:?usage: .ci/installed_wheel.sh PYTHON [VENV]}"
venv="$repo/${2:-.venv-wheel}"
shopt -s nullglob
wheels=(dist/*.whl)
if [ "${#wheels[@]}" -ne 1 ]; then
  echo "dist/ holds ${#wheels[@]} wheels, expected exactly one: run make dist first" >&2
  exit 1
fi
wheel="$repo/${wheels[0]}"

step() {  # step NAME COMMAND...: run, then print the wall time
  local name="$1" start=$SECONDS
  shift
  echo "== $name"
  "$@"
  echo "== $name: $((SECONDS - start)) s"
}

# No Rust: drop cargo's directories from PATH and its variables, then prove it.
PATH="$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -e '/\.cargo/bin$' -e '/\.rustup/' | paste -sd:)"
unset CARGO CARGO_HOME RUSTUP_HOME RUSTUP_TOOLCHAIN RUSTC
if command -v cargo >/dev/null || command -v rustc >/dev/null; then
  echo "cargo/rustc still on PATH ($(command -v cargo rustc)): the wheel install must not need them" >&2
  exit 1
fi

install() {
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --disable-pip-version-check -q -U 'pip>=25.1'
  # Binary wheels only, except PyPI's sdist-only pure-Python pyspark; --group reads ./pyproject.toml.
  "$venv/bin/pip" install --disable-pip-version-check -q --only-binary :all: --no-binary pyspark \
    -c .ci/constraints-newest.txt "$wheel[testing,spark,avro,metrics,serve]" --group test
  "$venv/bin/pip" list --disable-pip-version-check 2>/dev/null \
    | grep -iE '^(kafka-materializer|kafka-python|rocksdict|pyspark|confluent-kafka|pytest) '
}
step "install $(basename "$wheel") into a fresh $("$python" --version) venv, newest dependencies" install

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cd "$scratch"

installed() {
  "$venv/bin/materializer" --version
  "$venv/bin/python" - "$venv" <<'PY'
import sys
from pathlib import Path

import materializer
import materializer.storage._native as native

venv = Path(sys.argv[1]).resolve()
for module in (materializer, native):
    path = Path(module.__file__).resolve()
    if venv not in path.parents:
        sys.exit(f"{module.__name__} imported from {path}, not from the venv {venv}")
print(f"materializer {materializer.__version__}: {Path(materializer.__file__).parent}, {Path(native.__file__).name}")
PY
}
step "materializer --version, imports from the install" installed
step "materializer demo" "$venv/bin/materializer" demo --data-dir "$scratch/demo"
cp -r "$repo/examples/test_harness" "$scratch/test_harness"
step "examples/test_harness as a user's project" "$venv/bin/pytest" -p no:cacheprovider -q "$scratch/test_harness"

tests() {
  "$venv/bin/pytest" -c "$repo/pyproject.toml" --rootdir "$repo" --import-mode=append -p no:cacheprovider -q \
    "$@" || { rc=$?; [ $rc -eq 5 ] && { echo "pytest collected no tests" >&2; return 1; }; return $rc; }
}
# The unit tests and, beside them in a second pytest-xdist worker (tests/conftest.py groups the
# integration tests in one), the integration tests of the upper-bounded dependencies (PySpark).
# The mutation-fuzz and kill campaigns (about half of the unit tests' time) drive the same
# pure-Python recovery code on every interpreter; `make test` runs them, this phase does not.
# Replica fetch (kafka-python) is left to `make test` while pyproject allows one kafka-python
# release only (>=3.0.12,<3.1: its lowest is its newest); the unit tests still run the contract
# test of the internals it uses (test_kafka_python_contract.py) against this install.
step "unit tests and the integration tests of the bounded dependencies (PySpark)" tests -n 2 --dist loadgroup \
  "$repo/tests/unit" --ignore "$repo/tests/unit/test_mutation_fuzz.py" \
  --ignore "$repo/tests/unit/test_kill_campaign.py" \
  "$repo/tests/integration/test_spark_kafkalog.py" "$repo/tests/integration/test_spark_streaming.py"
