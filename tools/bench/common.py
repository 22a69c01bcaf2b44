"""What the peers' workload scripts share: the model, the JSON lines, the W4
check and the command line."""

import argparse
import functools
import json
import resource
import time

import numpy as np

IMAGE_BYTES = 64 * 64 * 3
EMBED_DIM = 256

# W1: 10 MiB rows; ideal time (160 x 0.5 + 800 x 0.05 CPU-seconds over 8 slots).
W1_ROW_BYTES = 10 << 20
W1_IDEAL_S = (160 * 0.5 + 800 * 0.05) / 8
# W2: 10 MiB and one byte, so that a row of the constant byte v sums to v mod 256.
W2_ROW_BYTES = (10 << 20) + 1


@functools.cache
def weights(seed=42):
    """The fixed 12,288 x 256 model matrix (loaded once per process)."""
    return np.random.default_rng(seed).uniform(-0.01, 0.01, size=(IMAGE_BYTES, EMBED_DIM)).astype(np.float32)


def parse_size(text):
    """`300MiB`, `4GiB` or bytes, as `streambatch bench --store-cap` takes them."""
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit, scale in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    return int(text)


class Progress:
    """Prints `{"progress": {...}}` lines at most once a second while a run
    iterates, so that the harness can report the rate a timed-out run reached."""

    def __init__(self, started):
        self.started = started
        self.last = started
        self.rows = 0
        self.partitions = 0

    def add(self, rows):
        self.rows += rows
        self.partitions += 1
        now = time.perf_counter()
        if now - self.last >= 1.0:
            self.last = now
            print(json.dumps({"progress": {"rows": self.rows, "partitions": self.partitions, "elapsed_s": round(now - self.started, 3)}}), flush=True)


def line(system, workload, config, wall, rows, partitions, correct, ideal_s=None):
    """Prints the result with the keys `streambatch bench` prints."""
    print(
        json.dumps(
            {
                "workload": workload,
                "system": system,
                "config": config,
                "wall_s": round(wall, 3),
                "rows_per_s": round(rows / wall, 3),
                "partitions_per_s": round(partitions / wall, 3),
                "efficiency": round(ideal_s / wall, 3) if ideal_s else None,
                # This process only; the harness samples the whole process tree.
                "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 3),
                "store_peak_bytes": None,
                "spilled_bytes": None,
                "correct": bool(correct),
            }
        ),
        flush=True,
    )


def embeddings_correct(ids, embeddings, images_by_id, step=25):
    """All images have an embedding, and every `step`-th equals a direct f64
    computation within 1e-4 of its largest value."""
    if len(ids) != len(images_by_id):
        return False
    w = weights().astype(np.float64)
    for i, emb in zip(ids, embeddings):
        if int(i) % step:
            continue
        pixels = (np.frombuffer(images_by_id[int(i)], dtype=np.uint8) / 255.0 - 0.5) / 0.25
        want = pixels @ w
        if np.max(np.abs(np.asarray(emb, dtype=np.float64) - want)) > 1e-4 * np.max(np.abs(want)):
            return False
    return True


def main(workloads, default_output):
    """Runs one of `workloads` ({name: function}) as the command line says."""
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=sorted(workloads))
    parser.add_argument("--rows", type=int, default=20_000, help="W3")
    parser.add_argument("--partitions", type=int, default=2_000, help="W3")
    parser.add_argument("--input", default="data/w4-images", help="W4")
    parser.add_argument("--output", default=default_output, help="W4")
    parser.add_argument("--store-cap", type=parse_size, default=None, help="W1, W2: object store memory")
    parser.add_argument("--tuned", action="store_true", help="W1: the documented GPU-stage settings that help Ray Data")
    parser.add_argument("--block-size", type=parse_size, default=None, help="W1, W2: Ray Data's target_max_block_size")
    args = parser.parse_args()
    workloads[args.workload](args)
