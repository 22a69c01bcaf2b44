#!/usr/bin/env bash
# Runs the benchmark workloads of docs/workloads.md in one go, printing each
# one's JSON line: W1 at both store caps, then W3.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin streambatch
bin=target/release/streambatch
"$bin" bench w1 --store-cap 300MiB
"$bin" bench w1 --store-cap 4GiB
"$bin" bench w3
