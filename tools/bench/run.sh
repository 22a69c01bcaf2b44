#!/usr/bin/env bash
# Runs W1 to W7, G1, J1, S1, S1 on a cluster and the binary-files benchmark
# in streambatch, Ray Data, (W3, W4, G1, J1, S1, W7) Daft, (W6a) PyTorch,
# (G1, J1, S1) DuckDB and Polars and (W7) onnxruntime alone, alternating the systems, each run under a time limit;
# prints one table with the ratio streambatch / peer, checks the targets,
# and writes out/bench/results.json,
# out/bench/table.md and the chart out/bench/benchmarks.png.
# Makes the Python environment (.venv-bench) with the pinned peers if absent.
#   tools/bench/run.sh [--limit-s 240] [--only w1,w2,w3,w4,w4_s3,binary_files,binary_files_rows,sched,w6a,w5,w6b,g1,j1,s1,s1_cluster,w7] [--w4-device cpu|gpu]
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=.venv-bench
# The stamp holds the requirements it was made from: an interrupted or
# outdated install is redone.
if ! cmp -s tools/bench/requirements.txt "$venv/installed.txt"; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q -r tools/bench/requirements.txt
    cp tools/bench/requirements.txt "$venv/installed.txt"
fi
cargo build --release --bin streambatch
# W4 from S3's server, a project of its own (not built by the tests).
cargo build --release --manifest-path tools/s3-server/Cargo.toml --target-dir "${CARGO_TARGET_DIR:-target}"
exec "$venv/bin/python" tools/bench/harness.py "$@"
