"""What the peers' workload scripts share: the model, the JSON line, the W4
check and the command line."""

import argparse
import functools
import json
import resource

import numpy as np

IMAGE_BYTES = 64 * 64 * 3
EMBED_DIM = 256


@functools.cache
def weights(seed=42):
    """The fixed 12,288 x 256 model matrix (loaded once per process)."""
    return np.random.default_rng(seed).uniform(-0.01, 0.01, size=(IMAGE_BYTES, EMBED_DIM)).astype(np.float32)


def line(system, workload, config, wall, rows, partitions, correct):
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
                "efficiency": None,
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


def main(w3, w4, default_output):
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=["w3", "w4"])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=2_000)
    parser.add_argument("--input", default="data/w4-images")
    parser.add_argument("--output", default=default_output)
    args = parser.parse_args()
    if args.workload == "w3":
        w3(args.rows, args.partitions)
    else:
        w4(args.input, args.output)
