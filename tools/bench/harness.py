"""Runs each workload in streambatch and in Ray Data, alternating the two
systems, each run under a time limit, sampling the peak RSS of each run's
whole process tree; prints one table with the ratio streambatch / Ray Data.

Covers W3 and W4 so far (docs/workloads.md); W1, W2, Daft, the tuned Ray
settings and the chart are still to come (issue 5).
"""

import argparse
import json
import subprocess
import sys
import threading
import time

import psutil

SB = ["target/release/streambatch", "bench"]
RAY = [sys.executable, "tools/bench/ray_workloads.py"]

# (name, metric, higher is better, streambatch command, ray command)
RUNS = [
    ("w3", "partitions_per_s", True, SB + ["w3"], RAY + ["w3"]),
    ("w4", "rows_per_s", True, SB + ["w4", "--device", "cpu"], RAY + ["w4"]),
]


def tree_rss(proc):
    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def run(cmd, limit_s):
    """Runs `cmd`; returns (last JSON line with the workload's figures or
    None, peak tree RSS in MiB, wall seconds, timed out)."""
    started = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    proc = psutil.Process(child.pid)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss(proc))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    lines = []
    timed_out = False
    try:
        out, _ = child.communicate(timeout=limit_s)
        lines = out.splitlines()
    except subprocess.TimeoutExpired:
        timed_out = True
        for p in [proc] + proc.children(recursive=True):
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        out, _ = child.communicate()
        lines = out.splitlines()
    done.set()
    sampler.join()
    records = [json.loads(l) for l in lines if l.startswith("{")]
    return records, peak[0] / 2**20, time.perf_counter() - started, timed_out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit-s", type=float, default=600)
    args = parser.parse_args()
    rows = []
    for name, metric, _, sb_cmd, ray_cmd in RUNS:
        results = {}
        for system, cmd in (("streambatch", sb_cmd), ("ray-data", ray_cmd)):
            records, rss, wall, timed_out = run(cmd, args.limit_s)
            # A workload's main figure is its last line with the metric (W4's
            # CPU line for streambatch comes first; take the matching config).
            mine = [r for r in records if metric in r and r.get("config") != "gpu_vs_cpu"]
            if name == "w4":
                mine = [r for r in mine if r.get("config") == "device=cpu"]
            record = mine[-1] if mine else {}
            results[system] = {
                "value": record.get(metric),
                "correct": record.get("correct"),
                "rss_mib": round(rss, 1),
                "wall_s": round(wall, 2),
                "timed_out": timed_out,
            }
            print(json.dumps({"workload": name, "system": system, **results[system]}), flush=True)
        sb, ray = results["streambatch"], results["ray-data"]
        ratio = sb["value"] / ray["value"] if sb["value"] and ray["value"] else None
        rows.append((name, metric, sb, ray, ratio))
    print()
    print(f"{'workload':<9} {'metric':<17} {'streambatch':>12} {'ray-data':>10} {'ratio':>8} {'sb RSS MiB':>11} {'ray RSS MiB':>12} {'correct':>8}")
    for name, metric, sb, ray, ratio in rows:
        def fmt(r):
            if r["timed_out"]:
                return "timeout"
            return f"{r['value']:.1f}" if r["value"] is not None else "failed"
        ratio_text = f"{ratio:.1f}x" if ratio else "-"
        correct = f"{sb['correct']}/{ray['correct']}"
        print(f"{name:<9} {metric:<17} {fmt(sb):>12} {fmt(ray):>10} {ratio_text:>8} {sb['rss_mib']:>11} {ray['rss_mib']:>12} {correct:>8}")


if __name__ == "__main__":
    main()
