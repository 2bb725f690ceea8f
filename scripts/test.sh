#!/usr/bin/env bash
# Full local/CI test run for the kaas workspace:
#   cargo fmt --check, cargo clippy -D warnings, cargo build --release,
#   cargo test --release --workspace, then the Python end-to-end suite
#   (tests/e2e) against target/release/kaas.
#
# Usage: scripts/test.sh            # everything
#        scripts/test.sh e2e [ARGS]  # only build + e2e pytest (extra ARGS go to pytest)
# Env:   KAAS_BIN          broker binary for e2e (default target/release/kaas)
#        CARGO_TARGET_DIR  honoured as usual
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT="$(pwd)"

MODE="${1:-all}"
if [ "$MODE" = "e2e" ]; then shift; fi

section() { printf '\n==================== %s ====================\n' "$*"; }
START_ALL=$SECONDS
run_step() {
    local name="$1"; shift
    section "$name"
    local t0=$SECONDS
    "$@"
    echo "---- $name: ok ($((SECONDS - t0)) s)"
}

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# The test clients live in the repository's venv (.ci/run makes it).
if [ -x "$ROOT/.venv/bin/python3" ]; then export PATH="$ROOT/.venv/bin:$PATH"; fi

if [ "$MODE" != "e2e" ]; then
    run_step "cargo fmt --check" cargo fmt --all --check
    run_step "cargo clippy" cargo clippy --workspace --all-targets -- -D warnings
fi
run_step "cargo build --release" cargo build --release --workspace
if [ "$MODE" != "e2e" ]; then
    run_step "cargo test --release" cargo test --release --workspace -q
fi

TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
export KAAS_BIN="${KAAS_BIN:-$TARGET_DIR/release/kaas}"

section "e2e tests (pytest tests/e2e, KAAS_BIN=$KAAS_BIN)"
t0=$SECONDS
set +e
python3 -m pytest -q -rfE --durations=30 tests/e2e "$@"
rc=$?
set -e
echo "---- e2e: pytest exit $rc ($((SECONDS - t0)) s)"
if [ "$rc" -eq 5 ]; then
    echo "ERROR: pytest collected no tests (exit 5); treating as failure" >&2
    exit 1
fi
if [ "$rc" -ne 0 ]; then
    exit "$rc"
fi

section "all green ($((SECONDS - START_ALL)) s)"
