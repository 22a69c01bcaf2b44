"""Ray Data side of the benchmark workloads (docs/workloads.md), written with
Ray Data's documented API and its defaults except where a workload sets a
value, or where `--tuned` names a documented setting that helps Ray Data.
Prints one JSON line last, with the keys `streambatch bench` prints.

    python tools/bench/ray_workloads.py w1 --store-cap 300MiB [--tuned] [--block-size 10MiB]
    python tools/bench/ray_workloads.py w2 --store-cap 512MiB
    python tools/bench/ray_workloads.py w3
    python tools/bench/ray_workloads.py w4 --input data/w4-images --output out/w4-ray
    python tools/bench/ray_workloads.py w4 --input s3://w4-bench/images/ --output out/w4-ray-s3   (AWS_ENDPOINT_URL, keys)
    python tools/bench/ray_workloads.py w5 --nodes 4
    python tools/bench/ray_workloads.py binary_files --store-cap 256MiB
    python tools/bench/ray_workloads.py w6a --step-ms 110
    python tools/bench/ray_workloads.py w6b --nodes 2
    python tools/bench/ray_workloads.py w7 --output out/w7-ray
"""

import contextlib
import json
import os
import shutil
import time

import numpy as np
import ray

from common import (
    W1_IDEAL_S, W1_ROW_BYTES, W2_ROW_BYTES, W3_WARM_UP, W6_EPOCHS, W6_IMAGES, W6_INPUT, W6_SEED, IdSet, Progress, crop_and_flip, normalise,
    check_w1_rows, embeddings_correct, image_id, line, main, normalised_rows, w1_byte, weights,
)


def start(args, **resources):
    # A fresh local instance, always: without `address="local"`, Ray joins
    # the cluster named in /tmp/ray/ray_current_cluster, which a killed run
    # (W5's head) can leave behind, and then fails.
    ray.init(address="local", include_dashboard=False, log_to_driver=False, **resources)
    if args.block_size:
        # Documented: blocks larger than this are split as they are produced.
        ray.data.DataContext.get_current().target_max_block_size = args.block_size


def filled_rows(ids):
    """A 10 MiB row per id, allocated and filled with its byte (as streambatch's W1)."""
    data = np.empty((len(ids), W1_ROW_BYTES), dtype=np.uint8)
    data[:] = w1_byte(ids)[:, None]
    return {"id": ids, "data": data}


def taking(seconds, make):
    """Runs `make`, then sleeps what is left of `seconds`: a stage whose
    task takes `seconds` in all, making its rows included (as streambatch's
    W1)."""
    started = time.perf_counter()
    out = make()
    time.sleep(max(0.0, seconds - (time.perf_counter() - started)))
    return out


def produce(batch):
    return taking(0.5, lambda: filled_rows(batch["id"]))


def consume(batch):
    return taking(0.05, lambda: filled_rows(batch["id"]))


def inference(batch):
    """Checks every byte of each row against its id's (a wrong row fails the
    job), within the stage's 0.05 s, as streambatch's W1 inference does."""
    taking(0.05, lambda: check_w1_rows(batch["id"], batch["data"]))
    return {"id": batch["id"]}


def check_ids(ds, started, n):
    """Reads a W1-shaped dataset's output, printing progress; returns the
    progress and the IdSet of 0..n it filled (each id must come once)."""
    progress = Progress(started)
    ids = IdSet(n)
    for batch in ds.iter_batches(batch_size=None):
        progress.add(len(batch["id"]))
        ids.add(batch["id"])
    return progress, ids


def w1(args):
    """8 CPU and 4 GPU logical slots, the object store capped. Tuned: the GPU
    stage reuses its workers (`max_calls=0`; Ray's default of 1 for GPU tasks
    starts a worker per task) and reserves no CPU (`num_cpus=0`; by default a
    GPU map task holds one of the 8 CPU slots)."""
    start(args, num_cpus=8, num_gpus=4, object_store_memory=args.store_cap)
    gpu_stage = {"num_cpus": 0, "max_calls": 0} if args.tuned else {}
    started = time.perf_counter()
    ds = (
        ray.data.range(800, override_num_blocks=160)
        .map_batches(produce, batch_size=5, num_cpus=1)
        .map_batches(consume, batch_size=1, num_cpus=1)
        .map_batches(inference, batch_size=1, num_gpus=1, **gpu_stage)
    )
    progress, ids = check_ids(ds, started, 800)
    wall = time.perf_counter() - started
    config = f"store_cap={args.store_cap >> 20}MiB" + (",tuned" if args.tuned else "") + (f",block_size={args.block_size >> 20}MiB" if args.block_size else "")
    line("ray-data", "w1", config, wall, progress.rows, 160, ids.each_once(), W1_IDEAL_S)


def expand(batch):
    """Ten rows of 10 MiB per input row, yielded one at a time."""
    first = int(batch["id"][0]) * 10
    for key in range(first, first + 10):
        yield {"key": np.array([key]), "data": np.full((1, W2_ROW_BYTES), key % 251, dtype=np.uint8)}


def reduce(batch):
    """Each row's byte sum mod 256, taking about 20 ms per row."""
    started = time.perf_counter()
    sums = batch["data"].sum(axis=1, dtype=np.int64) % 256
    time.sleep(max(0.0, 0.02 * len(sums) - (time.perf_counter() - started)))
    return {"key": batch["key"], "sum": sums}


def w2(args):
    start(args, object_store_memory=args.store_cap)
    started = time.perf_counter()
    ds = ray.data.range(100, override_num_blocks=100).map_batches(expand, batch_size=1).map_batches(reduce, batch_size=1)
    progress = Progress(started)
    correct = True
    for batch in ds.iter_batches(batch_size=None):
        progress.add(len(batch["key"]))
        correct &= bool(np.all(batch["sum"] == batch["key"] % 251))
    wall = time.perf_counter() - started
    config = f"store_cap={args.store_cap >> 20}MiB" + (f",block_size={args.block_size >> 20}MiB" if args.block_size else "")
    line("ray-data", "w2", config, wall, progress.rows, 100, correct and progress.rows == 1000)


def w3(args):
    start(args)

    def no_op(rows, partitions):
        return ray.data.range(rows, override_num_blocks=partitions).map_batches(lambda batch: batch).count()

    no_op(*W3_WARM_UP)  # untimed: workers started, code loaded, as every system does
    started = time.perf_counter()
    count = no_op(args.rows, args.partitions)
    wall = time.perf_counter() - started
    line("ray-data", "w3", f"rows={args.rows},partitions={args.partitions}", wall, count, args.partitions, count == args.rows)


def preprocess(batch):
    images = np.stack([np.frombuffer(b, dtype=np.uint8) for b in batch["image"]]).astype(np.float32)
    return {"id": batch["id"], "pixels": (images / 255.0 - 0.5) / 0.25}


class Embed:
    """The model: set up once per actor."""

    def __init__(self):
        self.weights = weights()

    def __call__(self, batch):
        return {"id": batch["id"], "embedding": batch["pixels"] @ self.weights}


def w4(args):
    shutil.rmtree(args.output, ignore_errors=True)  # Ray appends to an existing directory
    start(args)
    path, fs = input_files(args.input)
    started = time.perf_counter()
    ds = (
        ray.data.read_parquet(path, filesystem=fs)
        .map_batches(preprocess)
        # An autoscaling pool of 1 to one actor per CPU (2 here), as
        # streambatch's pool of 1..CPU slots. Each actor declares half a CPU:
        # a Ray actor holds its CPUs while it lives (a streambatch instance
        # holds a slot only while it runs a task), so with one CPU each, two
        # actors would hold both CPUs of a 2-CPU machine and the read and
        # preprocess tasks would never run (the job hangs).
        .map_batches(Embed, batch_size=64, concurrency=(1, os.cpu_count() or 2), num_cpus=0.5)
    )
    ds.write_parquet(args.output)
    wall = time.perf_counter() - started
    out = ray.data.read_parquet(args.output).to_pandas()
    images = ray.data.read_parquet(path, filesystem=fs).to_pandas()
    by_id = dict(zip(images["id"].to_numpy(dtype=np.int64), images["image"]))
    correct = embeddings_correct(out["id"].to_numpy(dtype=np.int64), out["embedding"], by_id)
    files = len(ray.data.read_parquet(path, filesystem=fs).input_files())
    line("ray-data", "w4", "device=cpu", wall, len(out), files, correct)


def input_files(path):
    """(path, filesystem) for Ray Data's readers: a local directory as it
    is, or an `s3://` URL through pyarrow's S3 filesystem, pointed at the
    endpoint and credentials of the environment (`AWS_ENDPOINT_URL`, as
    streambatch's client reads them)."""
    if not path.startswith("s3://"):
        return path, None
    import pyarrow.fs

    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    scheme = "http" if endpoint and endpoint.startswith("http://") else "https"
    fs = pyarrow.fs.S3FileSystem(
        endpoint_override=endpoint.split("://", 1)[1] if endpoint else None,
        scheme=scheme,
        access_key=os.environ.get("AWS_ACCESS_KEY_ID"),
        secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
        region=os.environ.get("AWS_REGION", "us-east-1"),
    )
    return path[len("s3://") :], fs


def w5(args):
    """W5 on a local multi-node Ray cluster (`ray.cluster_utils.Cluster`, each
    node its own raylet and object store on this host): a head with no slots,
    N nodes of 8 CPUs and one of 4N GPUs (no CPU), 300 MiB of object store
    each, as streambatch's W5. The GPU stage asks for no CPU (the GPU node
    has none: Ray's default of one CPU per task would never be placed) and
    reuses its workers (`max_calls=0`)."""
    with local_cluster(args.nodes, gpus=4 * args.nodes):
        w5_run(args.nodes)


@contextlib.contextmanager
def local_cluster(n, gpus):
    """A local multi-node Ray cluster, joined: a head with no slots, `n`
    nodes of 8 CPUs and one of `gpus` GPUs and no CPU, 300 MiB of object
    store each (W5, W6b)."""
    from ray.cluster_utils import Cluster

    store = 300 << 20
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "num_gpus": 0, "object_store_memory": store, "include_dashboard": False},
    )
    try:
        for _ in range(n):
            cluster.add_node(num_cpus=8, num_gpus=0, object_store_memory=store)
        cluster.add_node(num_cpus=0, num_gpus=gpus, object_store_memory=store)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        yield
    finally:
        # The nodes are daemons of their own: shut them down whatever
        # happened, or they outlive this run and slow the next one.
        ray.shutdown()
        cluster.shutdown()


def w5_run(n):
    rows = 800 * n
    started = time.perf_counter()
    ds = (
        ray.data.range(rows, override_num_blocks=160 * n)
        .map_batches(produce, batch_size=5, num_cpus=1)
        .map_batches(consume, batch_size=1, num_cpus=1)
        .map_batches(inference, batch_size=1, num_gpus=1, num_cpus=0, max_calls=0)
    )
    progress, ids = check_ids(ds, started, rows)
    wall = time.perf_counter() - started
    correct = ids.each_once()
    line("ray-data", "w5", f"nodes={n}", wall, progress.rows, 160 * n, correct, W1_IDEAL_S, nodes=n)


def binary_files(args):
    """`read_binary_files` over `streambatch bench binary-files`' input
    (data/binary-files: 5 files of 200 MiB among 200 small ones; its
    summary says what they hold), each file cut into 64 KiB pieces by a
    row-level `flat_map`, on 2 CPUs with the object store capped; the
    pieces' bytes summed in the driver."""
    directory = "data/binary-files"
    with open(directory + ".json") as f:
        expected = json.load(f)
    piece = expected["piece_bytes"]
    start(args, num_cpus=2, object_store_memory=args.store_cap)

    def cut(row):
        data = row["bytes"]
        return [{"path": row["path"], "offset": at, "bytes": data[at : at + piece]} for at in range(0, len(data), piece)]

    started = time.perf_counter()
    ds = ray.data.read_binary_files(directory, include_paths=True).flat_map(cut)
    progress = Progress(started)
    total = byte_sum = 0
    for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        column = batch.column("bytes")
        progress.add(len(column))
        for chunk in column.chunks:
            values = np.frombuffer(chunk.buffers()[2], dtype=np.uint8) if len(chunk) else np.zeros(0, np.uint8)
            offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int32 if chunk.type == "binary" else np.int64)
            first, last = offsets[chunk.offset], offsets[chunk.offset + len(chunk)]
            total += int(last - first)
            byte_sum += int(values[first:last].sum(dtype=np.uint64))
    wall = time.perf_counter() - started
    correct = (progress.rows, total, byte_sum) == (expected["pieces"], expected["bytes"], expected["byte_sum"])
    line("ray-data", "binary_files", f"store_cap={args.store_cap >> 20}MiB", wall, progress.rows, expected["files"], correct)


def w6_trainer_class():
    """A trainer actor (no CPU: the trainers stand for GPUs): reads its
    split for W6_EPOCHS epochs in batches of 64, each passed through
    `collate` (if any) after the shuffle, sleeping `step` per batch,
    checking every row; returns a report per epoch."""

    @ray.remote(num_cpus=0)
    class Trainer:
        def train(self, split, step, shuffle_rows, check, collate=None):
            reports = []
            for epoch in range(W6_EPOCHS):
                started, waited, ids, wrong = time.perf_counter(), 0.0, [], 0
                shuffle = dict(local_shuffle_buffer_size=shuffle_rows or None, local_shuffle_seed=W6_SEED + epoch if shuffle_rows else None)
                # Ray Data runs a collate_fn on its prefetch threads, as
                # streambatch's trainers run theirs.
                batches = iter(
                    split.iter_torch_batches(batch_size=64, collate_fn=collate, **shuffle)
                    if collate
                    else split.iter_batches(batch_size=64, batch_format="numpy", **shuffle)
                )
                while True:
                    asked = time.perf_counter()
                    try:
                        batch = next(batches)
                    except StopIteration:
                        break
                    waited += time.perf_counter() - asked
                    got, bad = check(batch)
                    ids.extend(got)
                    wrong += bad
                    time.sleep(step)  # the training step
                reports.append({"epoch": epoch, "took_s": time.perf_counter() - started, "waited_s": waited, "wrong_rows": wrong, "ids": ids})
            return reports

    return Trainer


def w6_run(ds, images, step, shuffle_rows, check, gpus=0, collate=None):
    """`ds` split equally between two trainer actors (each holding `gpus`
    GPUs, collating each batch with `collate`); (wall, images delivered,
    each rank's wait fraction, every image once per epoch and no wrong
    row)."""
    Trainer = w6_trainer_class()
    trainers = [Trainer.options(num_gpus=gpus).remote() for _ in range(2)]
    started = time.perf_counter()
    splits = ds.streaming_split(2, equal=True)
    reports = ray.get([t.train.remote(s, step, shuffle_rows, check, collate) for t, s in zip(trainers, splits)])
    wall = time.perf_counter() - started
    epochs = [IdSet(images) for _ in range(W6_EPOCHS)]
    wrong = delivered = 0
    fractions = []
    for rank in reports:
        for r in rank:
            epochs[r["epoch"]].add(r["ids"])
            wrong += r["wrong_rows"]
            delivered += len(r["ids"])
        took = sum(r["took_s"] for r in rank)
        fractions.append(round(sum(r["waited_s"] for r in rank) / took, 3) if took else 1.0)
    return wall, delivered, fractions, wrong == 0 and all(e.each_once() for e in epochs)


def w6a(args):
    """W6a: `read_images` over the JPEGs streambatch made (data/w6-images),
    the same crop and flip in `map_batches` (PIL and numpy),
    `streaming_split(2, equal=True)` read by two trainer actors with a
    1,000-row local shuffle buffer, normalising each batch to f32 as their
    collate (as streambatch's trainers do), on 2 CPUs."""
    start(args, num_cpus=2)
    from PIL import Image

    def transform(batch):
        rng = np.random.default_rng()
        pixels = [crop_and_flip(Image.fromarray(image), rng) for image in batch["image"]]
        return {"path": batch["path"], "pixels": np.stack(pixels)}

    from ray.data.collate_fn import NumpyBatchCollateFn

    class Normalise(NumpyBatchCollateFn):
        def __call__(self, batch):
            import torch

            return {"path": list(batch["path"]), "pixels": torch.from_numpy(normalise(batch["pixels"]))}

    def check(batch):
        return [image_id(p) for p in batch["path"]], normalised_rows(batch["pixels"].numpy())

    ds = ray.data.read_images(W6_INPUT, include_paths=True, mode="RGB").map_batches(transform)
    wall, delivered, fractions, correct = w6_run(ds, W6_IMAGES, args.step_ms / 1000, 1000, check, collate=Normalise())
    line("ray-data", "w6a", f"step_ms={args.step_ms}", wall, delivered, 0, correct, images_per_s=round(delivered / wall, 3), trainer_wait_fraction=fractions)


W6B_IMAGES, W6B_DECODE_S, W6B_PARTITION, W6B_TRAINERS_PER_S = 1_536, 0.040, 4, 600.0
W6B_IMAGE_BYTES = 224 * 224 * 3


def w6b(args):
    """W6b on a local multi-node Ray cluster as W5's: a head with no slots,
    N nodes of 8 CPUs, one of 2 GPUs and no CPU for the trainer actors;
    `decode` a 40 ms sleep per image making its 150,528 bytes (the id's
    byte, as streambatch's), batches of 4; no shuffle buffer."""
    n = args.nodes
    with local_cluster(n, gpus=2):

        def decode(batch):
            ids = batch["id"]
            return taking(W6B_DECODE_S * len(ids), lambda: {"id": ids, "data": np.repeat(w1_byte(ids)[:, None], W6B_IMAGE_BYTES, axis=1)})

        def check(batch):
            ids, data = batch["id"], batch["data"]
            wrong = int((data != w1_byte(ids)[:, None]).any(axis=1).sum()) + int(data.shape[1] != W6B_IMAGE_BYTES)
            return [int(i) for i in ids], wrong

        ds = ray.data.range(W6B_IMAGES, override_num_blocks=W6B_IMAGES // W6B_PARTITION).map_batches(decode, batch_size=W6B_PARTITION, num_cpus=1)
        step = 2 * 64 / W6B_TRAINERS_PER_S
        # A GPU each: the actors are placed on the trainer node.
        wall, delivered, fractions, correct = w6_run(ds, W6B_IMAGES, step, 0, check, gpus=1)
        ideal = min(n * 8 / W6B_DECODE_S, W6B_TRAINERS_PER_S)
        line(
            "ray-data", "w6b", f"nodes={n}", wall, delivered, 0, correct, W6_EPOCHS * W6B_IMAGES / ideal,
            images_per_s=round(delivered / wall, 3), trainer_wait_fraction=fractions, nodes=n, ideal_images_per_s=ideal,
        )


def w7(args):
    """W7: `read_images` (PIL, resized to 224) over the JPEGs streambatch
    made (data/w7), normalised in `map_batches`, scored by onnxruntime
    sessions in a `map_batches` actor pool, written as Parquet. One actor
    declaring one CPU (an actor holds its CPUs while it lives: two would
    leave none to decode on 2 CPUs) whose session computes on every CPU, as
    the limit's and streambatch's do."""
    import w7 as w

    shutil.rmtree(args.output, ignore_errors=True)
    start(args)

    class Scorer:
        def __init__(self):
            self.session = w.session()

        def __call__(self, batch):
            pixels = np.ascontiguousarray(batch["pixels"], dtype=np.float32)
            return {"path": batch["path"], "scores": self.session.run(["scores"], {"pixels": pixels})[0]}

    started = time.perf_counter()
    ds = (
        ray.data.read_images(os.path.join(w.W7_DIR, "images"), size=(w.W7_SIDE, w.W7_SIDE), mode="RGB", include_paths=True)
        .map_batches(lambda b: {"path": b["path"], "pixels": normalise(b["image"])})
        .map_batches(Scorer, batch_size=w.W7_BATCH_ROWS, concurrency=1, num_cpus=1)
    )
    ds.write_parquet(args.output)
    wall = time.perf_counter() - started
    ids, scores = w.read_scores(args.output)
    correct = w.own_check(ids, scores)
    line("ray-data", "w7", "onnxruntime", wall, len(ids), 0, correct, images_per_s=round(len(ids) / wall, 3))


if __name__ == "__main__":
    main({"w1": w1, "w2": w2, "w3": w3, "w4": w4, "w5": w5, "w6a": w6a, "w6b": w6b, "w7": w7, "binary_files": binary_files}, "out/w4-ray")
