"""Ray Data side of the benchmark workloads (docs/workloads.md), written with
Ray Data's documented API and its defaults except where a workload sets a
value. Prints one JSON line last, with the keys `streambatch bench` prints.

    python tools/bench/ray_workloads.py w3
    python tools/bench/ray_workloads.py w4 --input data/w4-images --output out/w4-ray
"""

import os
import shutil
import time

import numpy as np
import ray

from common import embeddings_correct, line, main, weights


def w3(rows, partitions):
    ray.init(include_dashboard=False, log_to_driver=False)
    started = time.perf_counter()
    ds = ray.data.range(rows, override_num_blocks=partitions).map_batches(lambda batch: batch)
    count = ds.count()
    wall = time.perf_counter() - started
    line("ray-data", "w3", f"rows={rows},partitions={partitions}", wall, count, partitions, count == rows)


def preprocess(batch):
    images = np.stack([np.frombuffer(b, dtype=np.uint8) for b in batch["image"]]).astype(np.float32)
    return {"id": batch["id"], "pixels": (images / 255.0 - 0.5) / 0.25}


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
        # One actor fewer than the CPUs: on 2 CPUs a pool of 2 would hold
        # every CPU and starve the read and preprocess tasks.
        .map_batches(Embed, batch_size=64, concurrency=max(1, (os.cpu_count() or 2) - 1))
    )
    ds.write_parquet(output_dir)
    wall = time.perf_counter() - started
    out = ray.data.read_parquet(output_dir).to_pandas()
    images = ray.data.read_parquet(input_dir).to_pandas()
    by_id = dict(zip(images["id"].to_numpy(dtype=np.int64), images["image"]))
    correct = embeddings_correct(out["id"].to_numpy(dtype=np.int64), out["embedding"], by_id)
    line("ray-data", "w4", "device=cpu", wall, len(out), len(os.listdir(input_dir)), correct)


if __name__ == "__main__":
    main(w3, w4, "out/w4-ray")
