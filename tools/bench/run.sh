#!/usr/bin/env bash
# Runs the benchmark workloads in streambatch and in Ray Data, alternating,
# and prints one table with each figure and the ratio streambatch / Ray Data.
# Makes the Python environment (.venv-bench) with the pinned peers if absent.
#   tools/bench/run.sh [--limit-s SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=.venv-bench
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q -r tools/bench/requirements.txt
fi
cargo build --release --bin streambatch
exec "$venv/bin/python" tools/bench/harness.py "$@"
