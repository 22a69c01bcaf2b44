#!/usr/bin/env bash
# Runs the benchmark workloads of docs/workloads.md in one go, printing each
# one's JSON line: W1 at both store caps, W2 at three, W3, the store.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin streambatch
bin="${CARGO_TARGET_DIR:-target}/release/streambatch"
"$bin" bench w1 --store-cap 300MiB
"$bin" bench w1 --store-cap 4GiB
for cap in 512MiB 1GiB 2GiB; do "$bin" bench w2 --store-cap "$cap"; done
"$bin" bench w3
"$bin" bench store
