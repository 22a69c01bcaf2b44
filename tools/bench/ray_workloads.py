"""Ray Data side of the benchmark workloads (docs/workloads.md), written with
Ray Data's documented API and its defaults except where a workload sets a
value. Prints one JSON line last, with the keys `streambatch bench` prints.

    python tools/bench/ray_workloads.py w3
    python tools/bench/ray_workloads.py w4 --input data/w4-images --output out/w4-ray
"""

import argparse
import json
import os
import resource
import shutil
import time

import numpy as np
import ray

IMAGE_BYTES = 64 * 64 * 3
EMBED_DIM = 256


def peak_rss_mib():
    # This process only; the harness samples the whole process tree.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def line(workload, config, wall, rows, partitions, correct, **extra):
    out = {
        "workload": workload,
        "system": "ray-data",
        "config": config,
        "wall_s": round(wall, 3),
        "rows_per_s": round(rows / wall, 3),
        "partitions_per_s": round(partitions / wall, 3),
        "efficiency": None,
        "peak_rss_mib": round(peak_rss_mib(), 3),
        "store_peak_bytes": None,
        "spilled_bytes": None,
        "correct": correct,
    }
    out.update(extra)
    print(json.dumps(out), flush=True)


def w3(rows, partitions):
    ray.init(include_dashboard=False, log_to_driver=False)
    started = time.perf_counter()
    ds = ray.data.range(rows, override_num_blocks=partitions).map_batches(lambda batch: batch)
    count = ds.count()
    wall = time.perf_counter() - started
    line("w3", f"rows={rows},partitions={partitions}", wall, count, partitions, count == rows)


def preprocess(batch):
    images = np.stack([np.frombuffer(b, dtype=np.uint8) for b in batch["image"]]).astype(np.float32)
    return {"id": batch["id"], "pixels": (images / 255.0 - 0.5) / 0.25}


def weights(seed=42):
    return np.random.default_rng(seed).uniform(-0.01, 0.01, size=(IMAGE_BYTES, EMBED_DIM)).astype(np.float32)


class Embed:
    """The model: set up once per actor."""

    def __init__(self):
        self.weights = weights()

    def __call__(self, batch):
        return {"id": batch["id"], "embedding": list(batch["pixels"] @ self.weights)}


def w4(input_dir, output_dir):
    shutil.rmtree(output_dir, ignore_errors=True)  # Ray appends to an existing directory
    ray.init(include_dashboard=False, log_to_driver=False)
    started = time.perf_counter()
    ds = (
        ray.data.read_parquet(input_dir)
        .map_batches(preprocess)
        # One actor: on 2 CPUs, a pool of 2 would hold every CPU and starve the
        # read and preprocess tasks.
        .map_batches(Embed, batch_size=64, concurrency=max(1, (os.cpu_count() or 2) - 1))
    )
    ds.write_parquet(output_dir)
    wall = time.perf_counter() - started
    # Check every 25th embedding against a direct computation.
    out = ray.data.read_parquet(output_dir).to_pandas()
    images = ray.data.read_parquet(input_dir).to_pandas().set_index("id")
    w = weights().astype(np.float64)
    sample = out[out["id"].to_numpy(dtype=np.int64) % 25 == 0]
    correct = len(out) == len(images) and len(sample) > 0
    for _, row in sample.iterrows():
        pixels = (np.frombuffer(images.loc[row["id"], "image"], dtype=np.uint8) / 255.0 - 0.5) / 0.25
        want = pixels @ w
        got = np.asarray(row["embedding"], dtype=np.float64)
        correct &= bool(np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want)))
    line("w4", "device=cpu", wall, len(out), len(os.listdir(input_dir)), bool(correct))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=["w3", "w4"])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=2_000)
    parser.add_argument("--input", default="data/w4-images")
    parser.add_argument("--output", default="out/w4-ray")
    args = parser.parse_args()
    if args.workload == "w3":
        w3(args.rows, args.partitions)
    else:
        w4(args.input, args.output)


if __name__ == "__main__":
    main()
