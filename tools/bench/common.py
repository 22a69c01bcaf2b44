"""What the peers' workload scripts share: the model, the JSON lines, the W4
check and the command line."""

import argparse
import functools
import json
import os
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


@functools.cache
def _odd_weights(n):
    """1, 3, 5, ... (n of them) as uint64, made once per row length."""
    return np.arange(1, 2 * n, 2, dtype=np.uint64)


def checksum(data):
    """streambatch_bench::checksum of `data` (bytes or a uint8 array): the
    wrapping sum of its little-endian uint64 words, word i weighted by
    2i + 1, a last partial word padded with zeros. Any one changed byte
    changes it."""
    b = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else np.ascontiguousarray(data, dtype=np.uint8).ravel()
    n = len(b) // 8
    total = int((b[: 8 * n].view("<u8") * _odd_weights(n)).sum(dtype=np.uint64)) if n else 0
    rest = b[8 * n :]
    if len(rest):
        last = int.from_bytes(rest.tobytes() + bytes(8 - len(rest)), "little")
        total += last * (2 * n + 1)
    return total % 2**64


def checksum_filled(byte, length):
    """checksum() of `length` bytes all equal to `byte`, without the bytes
    (n whole words weigh 1 + 3 + ... + (2n - 1) = n^2), as
    streambatch_bench::checksum_filled."""
    n, rest = divmod(length, 8)
    word = int.from_bytes(bytes([byte]) * 8, "little")
    last = int.from_bytes(bytes([byte]) * rest + bytes(8 - rest), "little")
    return (word * n * n + last * (2 * n + 1)) % 2**64


def check_w1_rows(ids, data):
    """Raises unless each row of `data` is W1_ROW_BYTES of w1_byte(its id),
    every byte checked (by checksum), as streambatch's W1 inference does."""
    for i, row in zip(ids, data):
        want = checksum_filled(int(w1_byte(np.int64(i))), W1_ROW_BYTES)
        if len(row) != W1_ROW_BYTES or checksum(row) != want:
            raise ValueError(f"row {i} does not hold its bytes")


class IdSet:
    """The ids of an output, checked against 0..n: each must come exactly
    once (a count and a sum would take 5, 5 for 4, 6), as streambatch's
    IdSet."""

    def __init__(self, n):
        self.n = n
        self.seen = np.zeros(n, dtype=bool)
        self.rows = 0
        self.foreign = 0

    def add(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        self.rows += len(ids)
        inside = ids[(ids >= 0) & (ids < self.n)]
        self.foreign += len(ids) - len(inside)
        self.seen[inside] = True

    def each_once(self):
        """As many rows as ids, none outside 0..n, every one seen: so none twice."""
        return self.rows == self.n and self.foreign == 0 and bool(self.seen.all())


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
        # `not (err <= tol)`: NaN compares false both ways, so `err > tol`
        # would let a NaN (an all-NaN embedding) pass.
        if not np.all(err <= 1e-4 * np.max(np.abs(want), axis=1)):
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
    parser.add_argument("--step-ms", type=int, default=110, help="W6a: a trainer's step per batch")
    parser.add_argument("--nodes", type=int, default=1, help="W5: CPU nodes")
    args = parser.parse_args()
    workloads[args.workload](args)


# W6: the training-ingest workloads (streambatch's crates/bench/src/w6).
W6_INPUT = "data/w6-images"
W6_IMAGES = 8_000
W6_EPOCHS = 2
W6_SEED = 7
W6_SIDE = 224
W6_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
W6_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
# The lowest and highest value normalising a byte gives over the channels
# (with a little room for rounding), as streambatch's trainers check.
W6_RANGE = (-2.1180, 2.6401)


def image_id(path):
    """The number of image `img-01234.jpg`."""
    return int(os.path.basename(path)[4:9])


def crop_box(rng, height, width, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's RandomResizedCrop box (top, left, h, w): an area of
    `scale` of the image's and an aspect ratio within `ratio` (log-uniform),
    10 tries, then the centre crop of the nearest ratio."""
    area = height * width
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = np.exp(rng.uniform(np.log(ratio[0]), np.log(ratio[1])))
        w = int(round(np.sqrt(target * aspect)))
        h = int(round(np.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    side = min(height, width)
    return (height - side) // 2, (width - side) // 2, side, side


def augment(image, rng):
    """A PIL RGB image -> random resized crop to 224 (bilinear) -> flip
    with probability 0.5 -> (x / 255 - mean) / std as f32, height x width x 3."""
    return normalise(crop_and_flip(image, rng))


def crop_and_flip(image, rng):
    """A PIL RGB image -> random resized crop to 224 (bilinear) -> flip
    with probability 0.5, as bytes (height x width x 3)."""
    from PIL import Image

    top, left, h, w = crop_box(rng, image.height, image.width)
    cropped = image.resize((W6_SIDE, W6_SIDE), Image.BILINEAR, box=(left, top, left + w, top + h))
    pixels = np.asarray(cropped, dtype=np.uint8)
    if rng.random() < 0.5:
        pixels = pixels[:, ::-1]
    return pixels


def normalise(pixels):
    """Bytes (any leading shape, 3 channels last) -> (x / 255 - mean) / std
    as f32."""
    return (pixels.astype(np.float32) * np.float32(1 / 255) - W6_MEAN) / W6_STD


def normalised_rows(pixels):
    """Rows of `pixels` (n x 224 x 224 x 3) with a value outside W6_RANGE
    or not a number (NaN fails both comparisons), or of the wrong shape."""
    if pixels.shape[1:] != (W6_SIDE, W6_SIDE, 3):
        return len(pixels)
    low, high = W6_RANGE
    rows = pixels.reshape(len(pixels), -1)
    # A row's least and greatest values: one pass each, no temporaries;
    # a NaN makes both NaN, which fails both comparisons.
    inside = (rows.min(axis=1) >= low) & (rows.max(axis=1) <= high)
    return int((~inside).sum())
