"""Runs W1 to W7 (W4 also read from a local S3 server), G1, J1, S1 and the binary-files benchmark (docs/workloads.md) in
streambatch, Ray Data, (W3, W4, G1, J1, S1, W7) Daft, (W6a) PyTorch's DataLoader,
(G1, J1, S1) DuckDB and Polars and (W7) onnxruntime alone, alternating the systems case by case, each run under a time limit,
sampling the peak memory of each run's whole process tree. Prints one table
with each figure and the ratio streambatch / peer, checks the targets of
docs/benchmarks.md, and writes the results (JSON), the table (Markdown) and a
chart (PNG).

    .venv-bench/bin/python tools/bench/harness.py [--limit-s 240] [--only w1,w3,w5]
"""

import argparse
import contextlib
import platform
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from importlib.metadata import version

import psutil

from common import W1_IDEAL_S, vmhwm_mib

# The binary run.sh built, wherever cargo puts its outputs.
SB = [os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "streambatch"), "bench"]
RAY = [sys.executable, "tools/bench/ray_workloads.py"]
DAFT = [sys.executable, "tools/bench/daft_workloads.py"]
TORCH = [sys.executable, "tools/bench/torch_workloads.py"]
G1 = [sys.executable, "tools/bench/g1.py", "run"]
G1_DATA = "data/g1"
J1 = [sys.executable, "tools/bench/j1.py", "run"]
J1_DATA = "data/j1"
S1 = [sys.executable, "tools/bench/s1.py", "run"]
S1_DATA = "data/s1"
# W4 from an S3-compatible store: tools/s3-server on 127.0.0.1, which the
# harness starts and fills with W4's files (W4_S3_URL), through boto3.
W4_DATA = "data/w4-images"
W4_S3_URL = "s3://w4-bench/images/"
# W4-from-S3's server (tools/s3-server), which run.sh builds.
S3_SERVER = os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "streambatch-s3-server")
# S1's store cap (`streambatch bench s1`) and the peak RSS allowed above it.
S1_CAP_MIB, S1_RSS_ABOVE_CAP_MIB = 512, 512

# What each workload reports and whether more of it is better.
METRICS = {
    "w1": ("efficiency", True),
    "w2": ("wall_s", False),
    "w3": ("partitions_per_s", True),
    "w4": ("rows_per_s", True),
    "w4_s3": ("rows_per_s", True),
    "w5": ("efficiency", True),
    "binary_files": ("wall_s", False),
    "binary_files_rows": ("wall_s", False),
    "sched": ("tasks_per_s", True),
    "w6a": ("images_per_s", True),
    "w6b": ("efficiency", True),
    "g1": ("wall_s", False),
    "j1": ("wall_s", False),
    "s1": ("wall_s", False),
    "s1_cluster": ("wall_s", False),
    "w7": ("images_per_s", True),
}
W1_ROWS = 800


@dataclass
class Case:
    """One workload at one setting, run by every system listed."""

    workload: str
    config: str
    commands: dict  # system label -> command line
    # Which JSON line of a run is this case's (streambatch's W3 prints two).
    pick: str = ""
    # W4: where each system writes, to count the rows of a timed-out run.
    outputs: dict = field(default_factory=dict)
    # W3: partitions in all, for the rate bound of a timed-out run.
    partitions: int = 0
    # A time limit of its own per run (S1), instead of --limit-s.
    limit_s: float = 0
    # Systems run more than once (system label -> runs), in turn with the
    # others so listed; each reports its run of median value.
    repeats: dict = field(default_factory=dict)


def cases(w4_device):
    out = []
    for cap in ["300MiB", "4GiB"]:
        ray = RAY + ["w1", "--store-cap", cap]
        out.append(
            Case(
                "w1",
                f"store cap {cap}",
                {
                    "streambatch": SB + ["w1", "--store-cap", cap, "--progress-lines"],
                    "ray-data": ray,
                    "ray-data tuned": ray + ["--tuned"],
                    "ray-data tuned, 10 MiB blocks": ray + ["--tuned", "--block-size", "10MiB"],
                },
            )
        )
    for cap in ["512MiB", "1GiB", "2GiB"]:
        out.append(
            Case(
                "w2",
                f"store cap {cap}",
                {
                    "streambatch": SB + ["w2", "--store-cap", cap, "--progress-lines"],
                    "ray-data": RAY + ["w2", "--store-cap", cap],
                    "ray-data 10 MiB blocks": RAY + ["w2", "--store-cap", cap, "--block-size", "10MiB"],
                },
            )
        )
    for rows, partitions in [(20_000, 2_000), (200_000, 200)]:
        shape = ["--rows", str(rows), "--partitions", str(partitions)]
        out.append(
            Case(
                "w3",
                f"{rows:,} rows in {partitions:,} partitions",
                # Each shape in a process of its own, after one untimed warm-up
                # run in that process (every system: common.W3_WARM_UP).
                {"streambatch": SB + ["w3"] + shape, "ray-data": RAY + ["w3"] + shape, "daft": DAFT + ["w3"] + shape},
                pick=f"rows={rows},partitions={partitions}",
                partitions=partitions,
            )
        )
    out.append(
        Case(
            "w4",
            f"2,000 images, {w4_device.upper()} model",
            {
                "streambatch": SB + ["w4", "--device", w4_device],
                "ray-data": RAY + ["w4"],
                "daft": DAFT + ["w4"],
            },
            pick=f"device={w4_device}",
            outputs={"streambatch": f"out/w4-{w4_device}", "ray-data": "out/w4-ray", "daft": "out/w4-daft"},
        )
    )
    # W4 read from S3 (tools/s3-server, s3s-fs on 127.0.0.1, the files
    # uploaded by the harness) against W4 from local disk, in the same run;
    # Ray Data reads the same bucket through pyarrow's S3 filesystem.
    out.append(
        Case(
            "w4_s3",
            "2,000 images read from S3 (s3s-fs, 127.0.0.1), CPU model",
            {
                "streambatch": SB + ["w4", "--device", "cpu", "--input", W4_S3_URL],
                "streambatch local disk": SB + ["w4", "--device", "cpu"],
                "ray-data": RAY + ["w4", "--input", W4_S3_URL, "--output", "out/w4-ray-s3"],
            },
            pick="device=cpu",
            outputs={"streambatch": "out/w4-cpu", "streambatch local disk": "out/w4-cpu", "ray-data": "out/w4-ray-s3"},
            # A job of 0.15 s, whose rate varies by 10% from run to run:
            # the two compared are each taken as the median of 5 runs.
            repeats={"streambatch": 5, "streambatch local disk": 5},
        )
    )
    # streambatch first: it makes the files (data/binary-files) if absent.
    out.append(
        Case(
            "binary_files",
            "5 x 200 MiB among 200 small files, store cap 256 MiB",
            {
                "streambatch": SB + ["binary-files", "--store-cap", "256MiB"],
                "ray-data": RAY + ["binary_files", "--store-cap", "256MiB"],
            },
        )
    )
    # The same files cut by a row-level flat_map (a row per piece), as Ray
    # Data's binary_files cuts them.
    out.append(
        Case(
            "binary_files_rows",
            "the same, cut by a row-level flat_map",
            {
                "streambatch": SB + ["binary-files", "--api", "rows", "--store-cap", "256MiB"],
                "ray-data": RAY + ["binary_files", "--store-cap", "256MiB"],
            },
        )
    )
    # The scheduler alone, so that a regression of the job state machine
    # shows in the next run (no peer: Ray's scheduler is not separable).
    out.append(Case("sched", "1,000 virtual nodes, fault simulation", {"streambatch": SB + ["sched"]}))
    # W6a: streambatch first, as it makes the JPEGs (data/w6-images).
    step = ["--step-ms", "110"]
    out.append(
        Case(
            "w6a",
            "8,000 JPEGs, 2 trainer processes, 110 ms step",
            {
                "streambatch": SB + ["w6a"] + step,
                "pytorch": TORCH + ["w6a"] + step,
                "ray-data": RAY + ["w6a"] + step,
            },
        )
    )
    # G1: the H2O groupby questions 1-5; J1: lineitem joined with orders,
    # revenue by priority (the tables made by g1.py and j1.py first).
    for workload, config, script, data in [
        ("g1", "H2O groupby q1-5, 10M rows", G1, G1_DATA),
        ("j1", "lineitem 6M x orders 1.5M", J1, J1_DATA),
    ]:
        peers = {system: script + [system, data] for system in ["duckdb", "polars", "ray-data", "daft"]}
        out.append(Case(workload, config, {"streambatch": SB + [workload], **peers}))
    # S1: 4 GB sorted through a 512 MiB store (made by s1.py), each
    # system's output checked by s1.py; Ray Data gets 10 minutes.
    out.append(
        Case(
            "s1",
            "40M rows of 100 bytes, 512 MiB store",
            {system: S1 + [system, S1_DATA] for system in ["streambatch", "duckdb", "polars", "ray-data", "daft"]},
            limit_s=600,
        )
    )
    # S1 on 3 node processes (512 MiB stores), a clean run, then one whose
    # third node is SIGKILLed mid-exchange; the second run's output checked
    # by s1.py as every system's.
    out.append(
        Case(
            "s1_cluster",
            "3 nodes, node-2 SIGKILLed mid-exchange",
            {"streambatch": S1 + ["streambatch-cluster", S1_DATA]},
            limit_s=600,
        )
    )
    # W7: streambatch first, as it makes the input (data/w7); then the
    # limit, whose scores every system's are checked against (check_w7).
    out.append(
        Case(
            "w7",
            "2,000 JPEGs, ResNet-50 (ONNX), onnxruntime",
            {
                "streambatch": SB + ["w7"],
                "onnxruntime limit": [sys.executable, "tools/bench/w7.py", "limit"],
                "ray-data": RAY + ["w7", "--output", "out/w7-ray"],
                "daft": DAFT + ["w7", "--output", "out/w7-daft"],
            },
            outputs={"streambatch": "out/w7-streambatch", "ray-data": "out/w7-ray", "daft": "out/w7-daft"},
        )
    )
    # W5 and W6b last: a multi-node Ray cluster that fails to stop cleanly
    # must not slow the other workloads.
    for n in [1, 2, 4]:
        out.append(
            Case(
                "w5",
                f"{n} CPU node{'s' if n > 1 else ''} + 1 GPU node",
                {
                    "streambatch": SB + ["w5", "--nodes", str(n)],
                    "ray-data": RAY + ["w5", "--nodes", str(n)],
                },
                pick=f"nodes={n}",
            )
        )
    for n in [1, 2, 4]:
        out.append(
            Case(
                "w6b",
                f"{n} CPU node{'s' if n > 1 else ''} + 2 trainers",
                {
                    "streambatch": SB + ["w6b", "--nodes", str(n)],
                    "ray-data": RAY + ["w6b", "--nodes", str(n)],
                },
                pick=f"nodes={n}",
            )
        )
    return out


def tree_memory(proc):
    """(RSS, PSS) in bytes and VmHWM in MiB, each summed over `proc` and its
    live descendants. PSS counts a page shared by n processes as 1/n in
    each, so that Ray's shared object store is counted once, not once per
    worker. VmHWM is each process's own peak RSS, which the kernel keeps
    between samples; summed over the processes alive together (not over
    every process ever seen, which would add up short-lived workers that
    never coexisted)."""
    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0, 0, 0
    rss = pss = hwm = 0
    for p in procs:
        try:
            info = p.memory_full_info()
            rss += info.rss
            pss += info.pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
        hwm += vmhwm_mib(p.pid) or 0
    return rss, pss, hwm


def run(cmd, limit_s):
    """Runs `cmd`; returns (its JSON lines, peak tree RSS and PSS in MiB
    (100 ms samples), the tree's VmHWM in MiB, wall seconds, whether it was
    stopped at the limit). The tree's VmHWM is the larger of the most the
    live processes' VmHWMs summed to and the `peak_rss_mib` the run printed
    (its own VmHWM at its end): a bound the samples cannot miss."""
    started = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    proc = psutil.Process(child.pid)
    peak = [0, 0, 0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            now = tree_memory(proc)
            peak[:] = [max(a, b) for a, b in zip(peak, now)]
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    timed_out = False
    try:
        out, _ = child.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        tree = [proc] + proc.children(recursive=True)
        for p in tree:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        out, _ = child.communicate()
        # Nothing of this run may linger into the next one.
        psutil.wait_procs(tree, timeout=30)
    wall = time.perf_counter() - started
    done.set()
    sampler.join()
    records = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    printed = [r["peak_rss_mib"] for r in records if r.get("peak_rss_mib") is not None]
    tree_hwm = max([peak[2]] + printed)
    return records, peak[0] / 2**20, peak[1] / 2**20, tree_hwm, wall, timed_out


def rows_written(directory):
    """Rows in the readable Parquet files under `directory` (a timed-out W4)."""
    import pyarrow.parquet as pq

    rows = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                rows += pq.ParquetFile(os.path.join(root, name)).metadata.num_rows
            except Exception:
                pass  # half-written or not Parquet
    return rows


def result_of(case, system, records, timed_out, wall, limit_s):
    """The case's figure from a run's JSON lines; for a run stopped at its
    limit, the rate it reached (from its progress lines or its output)."""
    metric, _ = METRICS[case.workload]
    finals = [r for r in records if metric in r and (not case.pick or r.get("config") == case.pick)]
    if finals and not timed_out:
        r = finals[-1]
        # W6's per-rank figures, for its targets and the table.
        kept = ("trainer_wait_fraction", "trainers_bound_images_per_s", "checksums", "peak_rss_mib")
        kept += ("pieces_from_driver", "pieces_from_nodes")
        # S1 on a cluster: the clean run and what the killed node cost.
        kept += ("clean_s", "killed_at_s", "nodes_lost", "remade_partitions", "rerun_tasks")
        kept += ("engine",)
        shown = {k: r[k] for k in kept if k in r}
        return {**shown, "value": r[metric], "correct": r.get("correct"), "reached": None}
    if not timed_out:
        return {"value": None, "correct": False, "reached": "failed: no result line"}
    progress = [r["progress"] for r in records if "progress" in r]
    if progress:
        p = progress[-1]
        rate = p["rows"] / p["elapsed_s"]
        reached = f"{p['rows']} rows in {p['elapsed_s']:.0f} s ({rate:.1f} rows/s)"
        if case.workload == "w1":
            value = round(W1_IDEAL_S * rate / W1_ROWS, 3)  # efficiency at that rate
        elif case.workload == "w2":
            value = round(p["elapsed_s"] * 1000 / max(p["rows"], 1), 1)  # projected wall
            reached += f", projected {value:.0f} s"
        else:
            value = None
        return {"value": value, "correct": None, "reached": reached}
    if case.workload in ("w4", "w4_s3"):
        rows = rows_written(case.outputs[system])
        return {"value": round(rows / wall, 1), "correct": None, "reached": f"{rows} rows written in {wall:.0f} s"}
    bound = case.partitions / limit_s if case.partitions else None
    return {"value": None, "correct": None, "reached": f"under {bound:.1f} partitions/s" if bound else "no progress reported"}


def same_answers(results, reference="duckdb"):
    """G1: each system's answers checked against DuckDB's: a result is
    correct only where its own check held and every checksum equals
    DuckDB's to 1e-9 relative (a NaN equals nothing)."""
    want = results.get(reference, {}).get("checksums")

    def close(a, b):
        return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1.0)

    for r in results.values():
        got = r.get("checksums")
        same = (
            want is not None
            and got is not None
            and len(got) == len(want)
            and all(len(g) == len(w) and all(close(x, y) for x, y in zip(g, w)) for g, w in zip(got, want))
        )
        r["correct"] = r.get("correct") is True and same


def check_w7(case, results):
    """W7: each system's scores against the limit's (tools/bench/w7.py):
    streambatch's, from the same tensors, within 1e-4 of each row's
    largest; the peers', decoded by their own libraries, within 5e-2. A
    result is correct only where its own check held too."""
    import w7

    for system, output in case.outputs.items():
        r = results.get(system)
        if r is None:
            continue
        tolerance = w7.SAME_TENSORS_TOLERANCE if system == "streambatch" else w7.OWN_DECODE_TOLERANCE
        limit_ran = results.get("onnxruntime limit", {}).get("correct") is True
        found = w7.check(output, tolerance) if limit_ran else {"correct": False, "worst": None}
        r["correct"] = r.get("correct") is True and found["correct"]
        r["worst_error"] = found["worst"]
        r["reached"] = (r["reached"] + "; " if r["reached"] else "") + f"largest error {found['worst']} (limit {tolerance})"


def onnxruntime_library():
    """The libonnxruntime of the bench venv's onnxruntime wheel (the one the
    limit and the peers run), for streambatch's `onnxruntime` engine."""
    import glob
    import importlib.util

    spec = importlib.util.find_spec("onnxruntime")
    for folder in spec.submodule_search_locations if spec else []:
        found = sorted(glob.glob(os.path.join(folder, "capi", "libonnxruntime.so*")))
        if found:
            return found[0]
    return None


def pick_best(case, results, peer):
    """(label, result) of the better of a peer's variants (its defaults or
    tuned) that has a figure, or None."""
    _, higher = METRICS[case.workload]
    rows = [(s, r) for s, r in results.items() if s.split(" ")[0] == peer and r["value"] is not None]
    if not rows:
        return None
    return (max if higher else min)(rows, key=lambda sr: sr[1]["value"])


# The peers named on the chart, with the package whose version they are.
PEERS = [("Ray Data", "ray"), ("Daft", "daft"), ("PyTorch", "torch"), ("DuckDB", "duckdb"), ("Polars", "polars"), ("onnxruntime", "onnxruntime")]


def installed(package):
    try:
        return version(package)
    except Exception:
        return "(not installed)"


def fmt(value):
    if value is None:
        return "-"
    return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"


def table(rows):
    """Markdown table: one line per system and case."""
    lines = [
        "| workload | case | system | metric | value | streambatch / it | peak RSS MiB | peak PSS MiB | VmHWM MiB | correct | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case, results in rows:
        metric, _ = METRICS[case.workload]
        sb = results["streambatch"]["value"]
        for system, r in results.items():
            ratio = "-"
            if system != "streambatch" and sb is not None and r["value"]:
                ratio = f"{sb / r['value']:.2f}"
            note = ("timeout: " + r["reached"]) if r["timed_out"] else (r["reached"] or "")
            if r.get("runs"):
                runs = f"median of {len(r['runs'])} runs: " + ", ".join(fmt(v) for v in r["runs"])
                note = f"{note}; {runs}" if note else runs
            lines.append(
                f"| {case.workload.upper()} | {case.config} | {system} | {metric} | {fmt(r['value'])} | {ratio} "
                f"| {r['rss_mib']:,.0f} | {r['pss_mib']:,.0f} | {r['hwm_mib']:,.0f} | {r['correct']} | {note} |"
            )
    return "\n".join(lines)


def targets(rows):
    """The targets of issue 5 / docs/benchmarks.md, each judged from this run.
    No target is met by a streambatch run whose output was not checked
    correct (`correct` true in its result line): a wrong result, a failed run
    and a run stopped at its limit (`correct` false or absent) miss every
    target, whatever their figures."""
    checks = []

    def check(name, ok, detail):
        # `sb`: the streambatch result of the case being judged (below).
        correct = sb.get("correct") is True
        if not correct:
            detail += f"; streambatch output not checked correct (correct: {sb.get('correct')})"
        checks.append({"target": name, "met": bool(ok) and correct, "detail": detail})

    for case, results in rows:
        sb = results["streambatch"]
        ray = pick_best(case, results, "ray-data")
        daft = pick_best(case, results, "daft")
        ray_v = ray[1]["value"] if ray else None
        if case.workload == "w1":
            check(
                f"W1 {case.config}: efficiency >= 0.95 and above Ray Data's",
                sb["value"] is not None and sb["value"] >= 0.95 and (ray_v is None or sb["value"] > ray_v),
                f"streambatch {fmt(sb['value'])}, Ray Data best ({ray[0] if ray else '-'}) {fmt(ray_v)}",
            )
        elif case.workload == "w2":
            cap_mib = {"512MiB": 512, "1GiB": 1024, "2GiB": 2048}[case.config.split()[-1]]
            # The larger of the sampled RSS and the VmHWM (which no sample misses).
            sb_mem = max(sb["rss_mib"], sb["hwm_mib"])
            check(
                f"W2 {case.config}: finishes, peak RSS <= cap + 256 MiB, wall <= half of Ray Data's",
                sb["value"] is not None
                and sb["correct"]
                and sb_mem <= cap_mib + 256
                and (ray_v is None or sb["value"] <= ray_v / 2),
                f"streambatch {fmt(sb['value'])} s at {sb_mem:.0f} MiB peak (RSS {sb['rss_mib']:.0f}, VmHWM {sb['hwm_mib']:.0f}; limit {cap_mib + 256}), "
                f"Ray Data {fmt(ray_v)} s, ratio {fmt(sb['value'] / ray_v) if sb['value'] and ray_v else '-'}",
            )
        elif case.workload == "w3" and case.pick == "rows=20000,partitions=2000":
            daft_v = daft[1]["value"] if daft else None
            check(
                "W3: partitions/s >= 100x Ray Data's and above Daft's",
                sb["value"] and ray_v and sb["value"] >= 100 * ray_v and (daft_v is None or sb["value"] > daft_v),
                f"streambatch {fmt(sb['value'])}, {fmt(sb['value'] / ray_v) if sb['value'] and ray_v else '-'}x Ray Data, "
                f"{fmt(sb['value'] / daft_v) if sb['value'] and daft_v else '-'}x Daft",
            )
        elif case.workload == "w5" and case.pick == "nodes=4":
            check(
                "W5 at 4 CPU nodes: efficiency >= 0.9, output checked",
                sb["value"] is not None and sb["value"] >= 0.9 and sb["correct"],
                f"streambatch {fmt(sb['value'])}, Ray Data ({ray[0] if ray else '-'}) {fmt(ray_v)}",
            )
        elif case.workload == "w6a":
            torch = pick_best(case, results, "pytorch")
            torch_v = torch[1]["value"] if torch else None
            # Memory by PSS: the trainers map the driver's shared memory.
            peers_pss = {s: r["pss_mib"] for s, r in results.items() if s != "streambatch"}
            bound = sb.get("trainers_bound_images_per_s")
            waits = sb.get("trainer_wait_fraction") or [1.0]
            check(
                "W6a: images/s >= 1.2x PyTorch DataLoader's and >= 2x Ray Data's",
                sb["value"] and torch_v and ray_v and sb["value"] >= 1.2 * torch_v and sb["value"] >= 2 * ray_v,
                f"streambatch {fmt(sb['value'])}, PyTorch {fmt(torch_v)} ({fmt(sb['value'] / torch_v) if sb['value'] and torch_v else '-'}x), "
                f"Ray Data {fmt(ray_v)} ({fmt(sb['value'] / ray_v) if sb['value'] and ray_v else '-'}x)",
            )
            check(
                "W6a: peak memory (PSS of the process tree) below PyTorch's and Ray Data's",
                peers_pss and all(sb["pss_mib"] < p for p in peers_pss.values()),
                f"streambatch {sb['pss_mib']:.0f} MiB, " + ", ".join(f"{s} {p:.0f} MiB" for s, p in peers_pss.items()),
            )
            check(
                "W6a: each trainer waits at most 5% of its time (the trainers are the bound)",
                max(waits) <= 0.05,
                f"wait fractions {waits}, trainers' bound {bound} images/s",
            )
        elif case.workload in ("g1", "j1"):
            best = {p: pick_best(case, results, p) for p in ("duckdb", "polars")}
            values = {p: b[1]["value"] if b else None for p, b in best.items()}
            daft_v = daft[1]["value"] if daft else None
            v = sb["value"]
            ok = v and ray_v and daft_v and all(values.values())
            check(
                f"{case.workload.upper()}: at least 10x Ray Data, ahead of Daft, at least 0.5x DuckDB and Polars; every answer DuckDB's",
                ok
                and v * 10 <= ray_v
                and v < daft_v
                and all(v <= 2 * x for x in values.values())
                and all(r["correct"] is True for r in results.values()),
                f"streambatch {fmt(v)} s; Ray Data {fmt(ray_v)} s ({fmt(ray_v / v) if ok else '-'}x), "
                f"Daft {fmt(daft_v)} s ({fmt(daft_v / v) if ok else '-'}x), "
                + ", ".join(f"{p} {fmt(x)} s ({fmt(x / v) if ok else '-'}x)" for p, x in values.items())
                + "; answers equal DuckDB's: "
                + ", ".join(f"{s} {r['correct']}" for s, r in results.items()),
            )
        elif case.workload == "s1":
            duck = pick_best(case, results, "duckdb")
            duck_v = duck[1]["value"] if duck else None
            ray_r = results.get("ray-data", {})
            v = sb["value"]
            # Ray Data stopped at the case's limit is at least that slow.
            ray_at_least = ray_v or (case.limit_s if ray_r.get("timed_out") else None)
            rss = sb.get("peak_rss_mib")
            check(
                f"S1: at least 5x Ray Data's throughput, at least 0.5x DuckDB's, peak RSS within the cap + {S1_RSS_ABOVE_CAP_MIB} MiB; order and checksum checked",
                v
                and ray_at_least
                and duck_v
                and rss
                and v * 5 <= ray_at_least
                and v <= 2 * duck_v
                and rss <= S1_CAP_MIB + S1_RSS_ABOVE_CAP_MIB,
                f"streambatch {fmt(v)} s, peak RSS {fmt(rss)} MiB; Ray Data {fmt(ray_v) if ray_v else f'over {fmt(ray_at_least)}' if ray_at_least else '-'} s"
                f" ({fmt(ray_at_least / v) if v and ray_at_least else '-'}x), DuckDB {fmt(duck_v)} s ({fmt(duck_v / v) if v and duck_v else '-'}x)",
            )
        elif case.workload == "s1_cluster":
            check(
                "S1 on 3 nodes, one SIGKILLed mid-exchange: every row, in order (checksum), its partitions made again",
                sb["value"] is not None and sb.get("nodes_lost") == ["node-2"] and (sb.get("remade_partitions") or 0) > 0,
                f"{fmt(sb['value'])} s with node-2 killed at {fmt(sb.get('killed_at_s'))} s "
                f"({sb.get('remade_partitions')} partitions made again, {sb.get('rerun_tasks')} tasks run again); "
                f"clean run {fmt(sb.get('clean_s'))} s",
            )
        elif case.workload == "w6b":
            check(
                f"W6b {case.config}: efficiency >= 0.9, every image once per epoch",
                sb["value"] is not None and sb["value"] >= 0.9,
                f"streambatch {fmt(sb['value'])}, Ray Data {fmt(ray_v)}",
            )
        elif case.workload in ("binary_files", "binary_files_rows"):
            # The larger of the sampled RSS and the VmHWM (which no sample misses).
            sb_mem = max(sb["rss_mib"], sb["hwm_mib"])
            ray_r = results.get("ray-data", {})
            cut = "row-level flat_map" if case.workload == "binary_files_rows" else "chunk_binary"
            check(
                f"binary files ({cut}): peak RSS <= 512 MiB at a 256 MiB store cap, output checked",
                sb["value"] is not None and sb["correct"] and sb_mem <= 512,
                f"streambatch {sb_mem:.0f} MiB (RSS {sb['rss_mib']:.0f}, VmHWM {sb['hwm_mib']:.0f}) in {fmt(sb['value'])} s; "
                f"Ray Data RSS {ray_r.get('rss_mib', 0):.0f} MiB, PSS {ray_r.get('pss_mib', 0):.0f} MiB in {fmt(ray_v)} s",
            )
        elif case.workload == "sched":
            check(
                "scheduler: the 1,000-node simulation at >= 350,000 tasks/s, every row once",
                sb["value"] is not None and sb["value"] >= 350_000,
                f"streambatch {fmt(sb['value'])} tasks/s",
            )
        elif case.workload == "w4_s3":
            local = results.get("streambatch local disk", {})
            local_v = local.get("value")
            v = sb["value"]
            check(
                "W4 read from S3 (s3s-fs on 127.0.0.1): rows/s >= 0.8x W4 from local disk in the same run (medians of 5 runs each)",
                v and local_v and v >= 0.8 * local_v and sb.get("correct") is True and local.get("correct") is True,
                f"streambatch from S3 {fmt(v)} rows/s, from local disk {fmt(local_v)} rows/s "
                f"({fmt(v / local_v) if v and local_v else '-'}x); Ray Data from S3 {fmt(ray_v)} rows/s "
                f"({fmt(v / ray_v) if v and ray_v else '-'}x)",
            )
        elif case.workload == "w7":
            limit = pick_best(case, results, "onnxruntime")
            limit_v = limit[1]["value"] if limit else None
            daft_v = daft[1]["value"] if daft else None
            v = sb["value"]
            peers_pss = {s: r["pss_mib"] for s, r in results.items() if s in ("ray-data", "daft")}
            check(
                "W7: images/s >= 0.9x onnxruntime alone's, >= 1.5x Ray Data's, >= 1.2x Daft's; every row's scores the limit's",
                v
                and limit_v
                and ray_v
                and daft_v
                and v >= 0.9 * limit_v
                and v >= 1.5 * ray_v
                and v >= 1.2 * daft_v
                and all(r["correct"] is True for r in results.values()),
                f"streambatch {fmt(v)} ({sb.get('engine', '-')}), limit {fmt(limit_v)} ({fmt(v / limit_v) if v and limit_v else '-'}x), "
                f"Ray Data {fmt(ray_v)} ({fmt(v / ray_v) if v and ray_v else '-'}x), Daft {fmt(daft_v)} ({fmt(v / daft_v) if v and daft_v else '-'}x); "
                + "checked: " + ", ".join(f"{s} {r['correct']}" for s, r in results.items()),
            )
            check(
                "W7: peak memory (PSS of the process tree) below Ray Data's and Daft's",
                len(peers_pss) == 2 and all(sb["pss_mib"] < p for p in peers_pss.values()),
                f"streambatch {sb['pss_mib']:.0f} MiB, " + ", ".join(f"{s} {p:.0f} MiB" for s, p in peers_pss.items()),
            )
        elif case.workload == "w4":
            daft_v = daft[1]["value"] if daft else None
            peers_pss = [r["pss_mib"] for s, r in results.items() if s != "streambatch"]
            check(
                "W4: rows/s >= Daft's, with less peak memory (PSS) than Ray Data and Daft",
                sb["value"] and daft_v and sb["value"] >= daft_v and all(sb["pss_mib"] < p for p in peers_pss),
                f"streambatch {fmt(sb['value'])} rows/s at {sb['pss_mib']:.0f} MiB, Daft {fmt(daft_v)}, "
                f"peers' memory {', '.join(f'{p:.0f}' for p in peers_pss)} MiB",
            )
    return checks


def chart(rows, path, title):
    """Per case, streambatch beside each peer's best variant: the case's
    figure (top) and peak memory (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {
        "streambatch": "#1b7837",
        "ray-data": "#2166ac",
        "daft": "#b2182b",
        "pytorch": "#e08214",
        "duckdb": "#8073ac",
        "polars": "#35978f",
        "onnxruntime": "#762a83",
    }
    fig, axes = plt.subplots(2, len(rows), figsize=(2.2 * len(rows), 6.5), squeeze=False)
    for col, (case, results) in enumerate(rows):
        metric, higher = METRICS[case.workload]
        shown = [("streambatch", results["streambatch"])]
        for peer in ("pytorch", "ray-data", "daft", "duckdb", "polars", "onnxruntime"):
            best = pick_best(case, results, peer)
            if best:
                shown.append((peer, best[1]))
        names = [s for s, _ in shown]
        panels = [("value", f"{metric}, {'higher' if higher else 'lower'} is better"), ("pss_mib", "peak memory, MiB (PSS)")]
        for row, (key, label) in enumerate(panels):
            ax = axes[row][col]
            values = [r[key] or 0 for _, r in shown]
            bars = ax.bar(range(len(shown)), values, color=[colours[n] for n in names])
            ax.bar_label(bars, labels=[fmt(v) for v in values], fontsize=6)
            if key == "value" and case.workload == "w3":
                ax.set_yscale("log")
            ax.margins(y=0.15)
            ax.set_xticks(range(len(shown)), names, rotation=30, ha="right", fontsize=7)
            ax.tick_params(axis="y", labelsize=7)
            if row == 0:
                ax.set_title(f"{case.workload.upper()}\n{case.config}", fontsize=8)
            if col == 0 or case.workload != rows[col - 1][0].workload:
                ax.set_ylabel(label, fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit-s", type=float, default=240, help="time limit of each run")
    parser.add_argument("--only", default="w1,w2,w3,w4,w4_s3,binary_files,binary_files_rows,sched,w6a,g1,j1,s1,s1_cluster,w7,w5,w6b", help="workloads to run, comma-separated")
    parser.add_argument("--w4-device", choices=["cpu", "gpu"], default="cpu", help="where streambatch runs W4's model")
    parser.add_argument("--out", default="out/bench", help="where results.json and table.md go")
    parser.add_argument("--chart", default=None, help="the chart's path (default: benchmarks.png in --out)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    args.chart = args.chart or os.path.join(args.out, "benchmarks.png")
    started = time.perf_counter()
    rows = []
    for case in cases(args.w4_device):
        if case.workload not in args.only.split(","):
            continue
        if case.workload == "g1":
            from g1 import make

            make(G1_DATA)
        if case.workload == "j1":
            from j1 import make

            make(J1_DATA)
        if case.workload in ("s1", "s1_cluster"):
            from s1 import make

            make(S1_DATA)
        if case.workload == "w7" and not os.environ.get("ORT_DYLIB_PATH"):
            # streambatch runs the model on the same onnxruntime as the peers.
            os.environ["ORT_DYLIB_PATH"] = onnxruntime_library() or ""
        s3 = w4_in_s3(case) if case.workload == "w4_s3" else contextlib.nullcontext()
        with s3:
            results = run_case(case, args)
        if case.workload in ("g1", "j1"):
            same_answers(results)
        if case.workload == "w7":
            check_w7(case, results)
        rows.append((case, results))
    report(rows, args, started)


@contextlib.contextmanager
def w4_in_s3(case):
    """W4's files (made by a local W4 run if absent) in W4_S3_URL's bucket of
    an S3 server on 127.0.0.1 started for the case (tools/s3-server: s3s-fs,
    built by run.sh, over a temporary folder), and the environment that
    points every client at it (streambatch's `AWS_*` variables, read by
    Ray's pyarrow filesystem too); the server stopped after."""
    import socket
    import tempfile

    import boto3

    if not os.path.exists(os.path.join(W4_DATA, "images-019.parquet")):
        subprocess.run(case.commands["streambatch local disk"], check=True, stdout=subprocess.DEVNULL)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    folder = tempfile.TemporaryDirectory(prefix="w4-s3-")
    secret = "w4-bench-secret"
    server = subprocess.Popen(
        [S3_SERVER, folder.name, str(port), "w4-bench", secret],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "w4-bench",
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        os.environ.update(env)
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        bucket, prefix = W4_S3_URL[len("s3://") :].split("/", 1)
        client.create_bucket(Bucket=bucket)
        for name in sorted(os.listdir(W4_DATA)):
            if name.endswith(".parquet"):
                client.upload_file(os.path.join(W4_DATA, name), bucket, prefix + name)
                # Read once, so that the server answers every system's
                # reads from memory (it reads a file on its first GET).
                client.get_object(Bucket=bucket, Key=prefix + name)["Body"].read()
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.kill()
        server.wait()
        folder.cleanup()


def run_case(case, args):
    """Runs each system of `case` (those in `case.repeats` as many times,
    in turn), printing a JSON line for each run; their results, a repeated
    system's the run of median value, with every run's value."""
    runs = {}
    for turn in range(max(case.repeats.values(), default=1)):
        for system, cmd in case.commands.items():
            if turn >= case.repeats.get(system, 1):
                continue
            limit_s = case.limit_s or args.limit_s
            records, rss, pss, hwm, wall, timed_out = run(cmd, limit_s)
            r = {
                **result_of(case, system, records, timed_out, wall, limit_s),
                "rss_mib": round(rss, 1),
                "pss_mib": round(pss, 1),
                "hwm_mib": round(hwm, 1),
                "wall_s": round(wall, 2),
                "timed_out": timed_out,
            }
            runs.setdefault(system, []).append(r)
            print(json.dumps({"workload": case.workload, "case": case.config, "system": system, **r}), flush=True)
    results = {}
    for system, rs in runs.items():
        if len(rs) == 1:
            results[system] = rs[0]
            continue
        # A failed run (no value) counts as the lowest.
        ordered = sorted(rs, key=lambda r: (r["value"] is not None, r["value"] or 0))
        median = ordered[len(ordered) // 2]
        results[system] = {**median, "runs": [r["value"] for r in rs], "correct": median["correct"] and all(r["correct"] for r in rs)}
    return results


def report(rows, args, started):
    """Prints the table and the targets; writes the results, table and chart."""
    total_s = time.perf_counter() - started
    text = table(rows)
    checks = targets(rows)
    print()
    print(text)
    print()
    for c in checks:
        print(f"{'MET ' if c['met'] else 'MISS'} {c['target']}: {c['detail']}")
    print(f"\nall runs: {total_s / 60:.1f} min")
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(
            {"minutes": round(total_s / 60, 1), "cases": [{**asdict(c), "results": r} for c, r in rows], "targets": checks},
            f,
            indent=1,
        )
    peers = ", ".join(f"{name} {installed(package)}" for name, package in PEERS)
    chart(rows, args.chart, f"streambatch, {peers}; {platform.node()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}")
    print(f"chart: {args.chart}")


if __name__ == "__main__":
    main()
