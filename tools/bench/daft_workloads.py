"""Daft (native runner) side of the benchmark workloads, W3 and W4.
Prints one JSON line last, with the keys `streambatch bench` prints.

    python tools/bench/daft_workloads.py w3
    python tools/bench/daft_workloads.py w4 --input data/w4-images --output out/w4-daft
"""

import argparse
import functools
import json
import os
import resource
import shutil
import time

import daft
import numpy as np
import pyarrow as pa

IMAGE_BYTES = 64 * 64 * 3
EMBED_DIM = 256


@daft.func.batch(return_dtype=daft.DataType.int64())
def noop(ids: daft.Series) -> daft.Series:
    return ids


def line(workload, config, wall, rows, partitions, correct):
    print(
        json.dumps(
            {
                "workload": workload,
                "system": "daft",
                "config": config,
                "wall_s": round(wall, 3),
                "rows_per_s": round(rows / wall, 3),
                "partitions_per_s": round(partitions / wall, 3),
                "efficiency": None,
                "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 3),
                "store_peak_bytes": None,
                "spilled_bytes": None,
                "correct": correct,
            }
        ),
        flush=True,
    )


def w3(rows, partitions):
    started = time.perf_counter()
    df = daft.range(0, rows, partitions=partitions)
    count = df.select(noop(df["id"])).count_rows()
    line("w3", f"rows={rows},partitions={partitions}", time.perf_counter() - started, count, partitions, count == rows)


@functools.cache
def weights(seed=42):
    """The model, loaded once per process (the native runner's workers are threads)."""
    return np.random.default_rng(seed).uniform(-0.01, 0.01, size=(IMAGE_BYTES, EMBED_DIM)).astype(np.float32)


@daft.func.batch(return_dtype=daft.DataType.fixed_size_list(daft.DataType.float32(), EMBED_DIM), batch_size=64)
def embed(images: daft.Series):
    pixels = np.stack([np.frombuffer(b, dtype=np.uint8) for b in images.to_pylist()]).astype(np.float32)
    out = ((pixels / 255.0 - 0.5) / 0.25) @ weights()
    return pa.FixedSizeListArray.from_arrays(pa.array(out.ravel()), EMBED_DIM)


def w4(input_dir, output_dir):
    shutil.rmtree(output_dir, ignore_errors=True)
    started = time.perf_counter()
    df = daft.read_parquet(f"{input_dir}/*.parquet")
    df = df.select(df["id"], embed(df["image"]).alias("embedding"))
    df.write_parquet(output_dir)
    wall = time.perf_counter() - started
    out = daft.read_parquet(f"{output_dir}/*.parquet").to_pydict()
    images = daft.read_parquet(f"{input_dir}/*.parquet").to_pydict()
    by_id = dict(zip(images["id"], images["image"]))
    w = weights().astype(np.float64)
    correct = len(out["id"]) == len(by_id)
    for i, emb in zip(out["id"], out["embedding"]):
        if i % 25:
            continue
        pixels = (np.frombuffer(by_id[i], dtype=np.uint8) / 255.0 - 0.5) / 0.25
        want = pixels @ w
        correct &= bool(np.max(np.abs(np.asarray(emb, dtype=np.float64) - want)) <= 1e-4 * np.max(np.abs(want)))
    line("w4", "device=cpu", wall, len(out["id"]), len(os.listdir(input_dir)), bool(correct))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=["w3", "w4"])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=2_000)
    parser.add_argument("--input", default="data/w4-images")
    parser.add_argument("--output", default="out/w4-daft")
    args = parser.parse_args()
    if args.workload == "w3":
        w3(args.rows, args.partitions)
    else:
        w4(args.input, args.output)


if __name__ == "__main__":
    main()
