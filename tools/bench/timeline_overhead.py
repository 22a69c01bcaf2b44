#!/usr/bin/env python3
"""What recording a timeline costs W3: `streambatch bench w3` (recording off)
against `streambatch bench w3 --timeline` (recording on), in one run:
`--rounds` rounds, each running both in turn, the first of the pair
alternating between rounds (a run's place in the pair biases it on a busy
machine). W3's own shapes by default; `--shape ROWS,PARTITIONS` (repeated)
runs others, as a longer one whose runs last a second. Prints each shape's
median rows/s with and without, and their ratio; exits 1 when recording
costs 2% or more.

    cargo build --release --bin streambatch
    python3 tools/bench/timeline_overhead.py [--rounds 41] [--shape 200000,20000] [--bin PATH]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(binary, timeline, shape):
    """One `bench w3` run: rows/s of each shape it ran, by config."""
    args = [binary, "bench", "w3"]
    if shape:
        rows, partitions = shape.split(",")
        args += ["--rows", rows, "--partitions", partitions]
    if timeline:
        args += ["--timeline", timeline]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    rates = {}
    for line in out.splitlines():
        if line.startswith("{"):
            result = json.loads(line)
            assert result["correct"], line
            rates[result["config"]] = result["rows_per_s"]
    return rates


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--shape", action="append", default=[])
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    parser.add_argument("--bin", default=os.path.join(target, "release", "streambatch"))
    args = parser.parse_args()
    without, with_ = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        for round in range(args.rounds):
            pair = [(None, without), (trace, with_)]
            if round % 2:
                pair.reverse()
            for shape in args.shape or [None]:
                for timeline, rates in pair:
                    for config, rate in run(args.bin, timeline, shape).items():
                        rates.setdefault(config, []).append(rate)
    worst = 1.0
    print(f"{'shape':<28} {'off rows/s':>12} {'on rows/s':>12} {'on/off':>8}")
    for config in without:
        off, on = statistics.median(without[config]), statistics.median(with_[config])
        ratio = on / off
        worst = min(worst, ratio)
        print(f"{config:<28} {off:>12.0f} {on:>12.0f} {ratio:>8.3f}")
    cost = (1 - worst) * 100
    print(f"recording costs at most {cost:.1f}% of W3's throughput (median of {args.rounds} runs each)")
    sys.exit(0 if worst > 0.98 else 1)


if __name__ == "__main__":
    main()
