"""W7, model batch inference (docs/workloads.md): what the peers share (the
input `streambatch bench w7` makes, the onnxruntime session, their own
check; the normalisation is common.normalise), the limit, and the check of
every system's output.

    python tools/bench/w7.py limit      # onnxruntime alone over the pre-decoded tensors
    python tools/bench/w7.py check OUT  # OUT's scores against the limit's, as JSON

The input, in data/w7 (made by `streambatch bench w7`): images/ (2,000
JPEGs of 256x256), resnet50.onnx (input `pixels` f32[N, 224, 224, 3],
output `scores` f32[N, 1000]) and tensors.npy (every image decoded,
resized and normalised by streambatch's own operators, in id order).
"""

import json
import os
import sys
import time

import numpy as np

from common import IdSet, image_id, line, normalise

W7_DIR = "data/w7"
W7_IMAGES = 2_000
W7_SIDE = 224
W7_CLASSES = 1000
# Rows per model call, for every system (streambatch's W7_BATCH_ROWS).
W7_BATCH_ROWS = 32
LIMIT_SCORES = "out/w7-limit/scores.npy"
# Within this of a row's largest score (relative), a score equals the
# limit's: the same tensors through the same model, batched differently.
SAME_TENSORS_TOLERANCE = 1e-4
# The peers decode and resize with their own libraries (PIL, Daft's image
# crate build), whose pixels differ from streambatch's by a level or two:
# their scores are checked within this of a row's largest instead.
OWN_DECODE_TOLERANCE = 5e-2


def session(threads=None):
    """An onnxruntime session of W7's model on `threads` intra-op threads
    (default: every CPU), one inter-op thread, as streambatch's sessions."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or os.cpu_count()
    options.inter_op_num_threads = 1
    return ort.InferenceSession(os.path.join(W7_DIR, "resnet50.onnx"), options, providers=["CPUExecutionProvider"])


def each_image_once(ids):
    """Every image of 0..W7_IMAGES has exactly one row among `ids`."""
    seen = IdSet(W7_IMAGES)
    seen.add(ids)
    return seen.each_once()


def own_check(ids, scores):
    """A peer's own check: every image once, every score finite."""
    return each_image_once(ids) and bool(np.isfinite(scores).all())


def limit(args):
    """onnxruntime alone: the pre-decoded tensors (memory-mapped) in
    batches of W7_BATCH_ROWS through one session on every CPU; timed from
    the first batch to the last score (the session loaded before)."""
    tensors = np.load(os.path.join(W7_DIR, "tensors.npy"), mmap_mode="r")
    sess = session()
    started = time.perf_counter()
    scores = np.empty((len(tensors), W7_CLASSES), dtype=np.float32)
    for start in range(0, len(tensors), W7_BATCH_ROWS):
        batch = np.ascontiguousarray(tensors[start : start + W7_BATCH_ROWS])
        scores[start : start + len(batch)] = sess.run(["scores"], {"pixels": batch})[0]
    wall = time.perf_counter() - started
    os.makedirs(os.path.dirname(LIMIT_SCORES), exist_ok=True)
    np.save(LIMIT_SCORES + ".tmp.npy", scores)
    os.replace(LIMIT_SCORES + ".tmp.npy", LIMIT_SCORES)
    correct = len(scores) == W7_IMAGES and bool(np.isfinite(scores).all())
    line("onnxruntime", "w7", "limit", wall, len(scores), len(scores), correct, images_per_s=round(len(scores) / wall, 3))


def read_scores(output):
    """(ids, scores n x 1000) of the Parquet files under `output`: rows
    named by `path` (img-NNNNN.jpg), scores a list or tensor column."""
    import pyarrow.parquet as pq

    ids, scores = [], []
    for root, _, files in os.walk(output):
        for name in sorted(files):
            if not name.endswith(".parquet"):
                continue
            table = pq.read_table(os.path.join(root, name))
            ids += [image_id(p) for p in table.column("path").to_pylist()]
            column = table.column("scores").combine_chunks()
            if hasattr(column, "to_numpy_ndarray"):  # Ray's tensor extension type
                scores.append(column.to_numpy_ndarray().reshape(len(column), -1))
            else:
                scores.append(np.stack([np.asarray(s, dtype=np.float32) for s in column.to_pylist()]))
    return np.asarray(ids, dtype=np.int64), (np.concatenate(scores) if scores else np.zeros((0, W7_CLASSES)))


def check(output, tolerance):
    """Every image once in `output`, each row's 1,000 scores within
    `tolerance` of its largest limit score of the limit's (a NaN equals
    nothing): {"correct", "rows", "worst"}."""
    want = np.load(LIMIT_SCORES)
    ids, got = read_scores(output)
    if not each_image_once(ids) or got.shape != (W7_IMAGES, W7_CLASSES):
        return {"correct": False, "rows": len(ids), "worst": None}
    want = want[ids]
    scale = np.maximum(np.abs(want).max(axis=1), 1e-6)
    err = (np.abs(got - want).max(axis=1)) / scale
    # `not (err <= tol)` catches NaN, which compares false both ways.
    ok = bool(np.all(err <= tolerance))
    worst = float(np.nanmax(err)) if np.isfinite(err).any() else None
    return {"correct": ok, "rows": len(ids), "worst": worst if np.isfinite(err).all() else float("nan")}


if __name__ == "__main__":
    if sys.argv[1:2] == ["limit"]:
        limit(sys.argv[2:])
    elif sys.argv[1:2] == ["check"]:
        tolerance = float(sys.argv[3]) if len(sys.argv) > 3 else SAME_TENSORS_TOLERANCE
        print(json.dumps(check(sys.argv[2], tolerance)))
    else:
        sys.exit(__doc__)
