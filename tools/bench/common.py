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
# W3: the untimed run each system makes first, in the same process, before its
# timed shape (rows, partitions): as `streambatch bench w3` does (W3_WARM_UP).
W3_WARM_UP = (1_000, 20)


def w1_byte(ids):
    """The byte W1's row `id` is filled with (never 0, so that filling a row
    writes every page), as in streambatch's W1."""
    return (ids % 255 + 1).astype(np.uint8)


def vmhwm_mib(pid="self"):
    """A process's peak resident memory (VmHWM) in MiB, or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for l in f:
                if l.startswith("VmHWM:"):
                    return int(l.split()[1]) / 1024
    except OSError:
        pass
    return None


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


def line(system, workload, config, wall, rows, partitions, correct, ideal_s=None, **extra):
    """Prints the result with the keys `streambatch bench` prints (and any
    workload's own, as W5's `nodes`)."""
    print(
        json.dumps(
            extra | {
                "workload": workload,
                "system": system,
                "config": config,
                "wall_s": round(wall, 3),
                "rows_per_s": round(rows / wall, 3),
                "partitions_per_s": round(partitions / wall, 3),
                "efficiency": round(ideal_s / wall, 3) if ideal_s else None,
                "rows": rows,
                # This process's VmHWM, read at the end of the run; the harness
                # also follows every process of the tree.
                "peak_rss_mib": round(vmhwm_mib() or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 3),
                "store_peak_bytes": None,
                "spilled_bytes": None,
                "correct": bool(correct),
            }
        ),
        flush=True,
    )


def embeddings_correct(ids, embeddings, images_by_id, chunk=64):
    """Every image has exactly one embedding, and every embedding written
    equals a direct f64 computation within 1e-4 of its largest value (as
    `streambatch bench w4` checks). Computed `chunk` rows at a time."""
    ids = [int(i) for i in ids]
    embeddings = list(embeddings)
    if len(ids) != len(images_by_id) or set(ids) != set(images_by_id):
        return False
    w = weights().astype(np.float64)
    for start in range(0, len(ids), chunk):
        part = ids[start : start + chunk]
        pixels = (np.stack([np.frombuffer(images_by_id[i], dtype=np.uint8) for i in part]) / 255.0 - 0.5) / 0.25
        want = pixels @ w
        got = np.stack([np.asarray(e, dtype=np.float64) for e in embeddings[start : start + chunk]])
        if got.shape != want.shape:
            return False
        err = np.max(np.abs(got - want), axis=1)
        if np.any(err > 1e-4 * np.max(np.abs(want), axis=1)):
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
    parser.add_argument("--nodes", type=int, default=1, help="W5: CPU nodes")
    args = parser.parse_args()
    workloads[args.workload](args)
