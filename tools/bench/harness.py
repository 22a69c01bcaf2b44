"""Runs each workload in streambatch and in Ray Data, alternating the two
systems, each run under a time limit, sampling the peak RSS of each run's
whole process tree; prints one table with the ratio streambatch / Ray Data.

Covers W3 and W4, with Daft beside them, so far (docs/workloads.md); W1,
W2, the tuned Ray settings and the chart are still to come (issue 5).
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
DAFT = [sys.executable, "tools/bench/daft_workloads.py"]

# (name, metric, {system: command}); systems run in this order.
RUNS = [
    ("w3", "partitions_per_s", {"streambatch": SB + ["w3"], "ray-data": RAY + ["w3"], "daft": DAFT + ["w3"]}),
    ("w4", "rows_per_s", {"streambatch": SB + ["w4", "--device", "cpu"], "ray-data": RAY + ["w4"], "daft": DAFT + ["w4"]}),
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
    for name, metric, commands in RUNS:
        results = {}
        for system, cmd in commands.items():
            records, rss, wall, timed_out = run(cmd, args.limit_s)
            # Streambatch's W4 also prints GPU lines; take the CPU one.
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
        rows.append((name, metric, results))
    print()
    print(f"{'workload':<9} {'metric':<17} {'system':<12} {'value':>10} {'streambatch/it':>15} {'peak RSS MiB':>13} {'correct':>8}")
    for name, metric, results in rows:
        sb = results["streambatch"]["value"]
        for system, r in results.items():
            value = "timeout" if r["timed_out"] else (f"{r['value']:.1f}" if r["value"] is not None else "failed")
            ratio = f"{sb / r['value']:.1f}x" if sb and r["value"] and system != "streambatch" else "-"
            print(f"{name:<9} {metric:<17} {system:<12} {value:>10} {ratio:>15} {r['rss_mib']:>13} {str(r['correct']):>8}")


if __name__ == "__main__":
    main()
