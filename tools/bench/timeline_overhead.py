#!/usr/bin/env python3
"""What recording a timeline costs W3: `streambatch bench w3` (recording off)
against `streambatch bench w3 --timeline` (recording on), in one run:
`--rounds` rounds, each running both in turn, the first of the pair
alternating between rounds (a run's place in the pair biases it on a busy
machine), each run with an environment of random size (0-4 KiB): where
the stack starts moves a short run's speed by several per cent (one more
argument, `--timeline PATH`, does too), and a random one averages that
out. W3's own shapes by default; `--shape ROWS,PARTITIONS` (repeated)
runs others, as a longer one whose runs last a second.

A W3 run lasts 7 ms (200 partitions) or 60 ms (2,000) on 2 cores, and one
run's rate spreads by +-25% around its median, so the two arms are
compared by the median of each round's on/off ratio (the rounds pair them),
with a 95% interval from resampling the rounds, and by the ratio of the
rates the fastest quarter of each arm's runs reach (noise only slows a run
down). Prints each shape's median rows/s with and without, both ratios and
their intervals; exits 1 when the median ratio says recording costs 2% or
more.

    cargo build --release --bin streambatch
    python3 tools/bench/timeline_overhead.py [--rounds 201] [--shape 200000,20000] [--bin PATH]
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile


def run(binary, timeline, shape, pad):
    """One `bench w3` run: rows/s of each shape it ran, by config. `pad`
    bytes of environment shift where the process's stack starts."""
    args = [binary, "bench", "w3"]
    if shape:
        rows, partitions = shape.split(",")
        args += ["--rows", rows, "--partitions", partitions]
    if timeline:
        args += ["--timeline", timeline]
    env = dict(os.environ, SB_BENCH_PAD="x" * pad)
    out = subprocess.run(args, check=True, capture_output=True, text=True, env=env).stdout
    rates = {}
    for line in out.splitlines():
        if line.startswith("{"):
            result = json.loads(line)
            assert result["correct"], line
            rates[result["config"]] = result["rows_per_s"]
    return rates


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=201)
    parser.add_argument("--shape", action="append", default=[])
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    parser.add_argument("--bin", default=os.path.join(target, "release", "streambatch"))
    args = parser.parse_args()
    without, with_ = {}, {}
    layout = random.Random(2)
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        for round in range(args.rounds):
            pair = [(None, without), (trace, with_)]
            if round % 2:
                pair.reverse()
            for shape in args.shape or [None]:
                for timeline, rates in pair:
                    pad = layout.randrange(4096)
                    for config, rate in run(args.bin, timeline, shape, pad).items():
                        rates.setdefault(config, []).append(rate)
    worst = 1.0
    print(
        f"{'shape':<30} {'off rows/s':>12} {'on rows/s':>12} {'on/off':>7} {'95% interval':>13}"
        f" {'fast quarter':>12} {'95% interval':>13}"
    )
    for config in without:
        off, on = without[config], with_[config]
        ratios = [a / b for a, b in zip(on, off)]
        ratio = statistics.median(ratios)
        low, high = interval(ratios, statistics.median)
        fast = fast_quarter(on) / fast_quarter(off)
        fast_low, fast_high = interval(list(zip(on, off)), fast_ratio)
        worst = min(worst, ratio)
        print(
            f"{config:<30} {statistics.median(off):>12.0f} {statistics.median(on):>12.0f}"
            f" {ratio:>7.3f} {low:>6.3f}-{high:.3f} {fast:>12.3f} {fast_low:>6.3f}-{fast_high:.3f}"
        )
    cost = (1 - worst) * 100
    print(f"recording costs at most {cost:.1f}% of W3's throughput ({args.rounds} paired rounds)")
    sys.exit(0 if worst > 0.98 else 1)


def fast_quarter(rates):
    """The rate the fastest quarter of runs reach (the 75th percentile):
    a slow run is slow for the machine's reasons, a fast one shows the code."""
    return statistics.quantiles(rates, n=4)[2]


def fast_ratio(pairs):
    return fast_quarter([on for on, _ in pairs]) / fast_quarter([off for _, off in pairs])


def interval(sample, statistic, resamples=2000):
    """A 95% bootstrap interval of `statistic` over `sample` (the rounds)."""
    rng = random.Random(1)
    values = sorted(statistic(rng.choices(sample, k=len(sample))) for _ in range(resamples))
    return values[int(0.025 * resamples)], values[int(0.975 * resamples)]


if __name__ == "__main__":
    main()
