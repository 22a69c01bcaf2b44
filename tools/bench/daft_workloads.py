"""Daft (native runner) side of the benchmark workloads, W3 and W4.
Prints one JSON line last, with the keys `streambatch bench` prints.

    python tools/bench/daft_workloads.py w3
    python tools/bench/daft_workloads.py w4 --input data/w4-images --output out/w4-daft
    python tools/bench/daft_workloads.py w7 --output out/w7-daft
"""

import os
import shutil
import time

import daft
import numpy as np
import pyarrow as pa

from common import EMBED_DIM, W3_WARM_UP, embeddings_correct, line, main, normalise, weights


@daft.func.batch(return_dtype=daft.DataType.int64())
def noop(ids: daft.Series) -> daft.Series:
    return ids


def w3(args):
    def no_op(rows, partitions):
        df = daft.range(0, rows, partitions=partitions)
        return df.select(noop(df["id"])).count_rows()

    no_op(*W3_WARM_UP)  # untimed: runner started, code loaded, as every system does
    started = time.perf_counter()
    count = no_op(args.rows, args.partitions)
    config = f"rows={args.rows},partitions={args.partitions}"
    line("daft", "w3", config, time.perf_counter() - started, count, args.partitions, count == args.rows)


@daft.func.batch(return_dtype=daft.DataType.fixed_size_list(daft.DataType.float32(), EMBED_DIM), batch_size=64)
def embed(images: daft.Series):
    pixels = np.stack([np.frombuffer(b, dtype=np.uint8) for b in images.to_pylist()]).astype(np.float32)
    out = ((pixels / 255.0 - 0.5) / 0.25) @ weights()
    return pa.FixedSizeListArray.from_arrays(pa.array(out.ravel()), EMBED_DIM)


def w4(args):
    input_dir, output_dir = args.input, args.output
    shutil.rmtree(output_dir, ignore_errors=True)
    started = time.perf_counter()
    df = daft.read_parquet(f"{input_dir}/*.parquet")
    df = df.select(df["id"], embed(df["image"]).alias("embedding"))
    df.write_parquet(output_dir)
    wall = time.perf_counter() - started
    out = daft.read_parquet(f"{output_dir}/*.parquet").to_pydict()
    images = daft.read_parquet(f"{input_dir}/*.parquet").to_pydict()
    correct = embeddings_correct(out["id"], out["embedding"], dict(zip(images["id"], images["image"])))
    line("daft", "w4", "device=cpu", wall, len(out["id"]), len(os.listdir(input_dir)), correct)


def w7(args):
    """W7: the JPEGs streambatch made (data/w7) downloaded, decoded and
    resized to 224 by Daft's own image functions, normalised and scored by
    an onnxruntime session in a Daft class (one instance, its session on
    every CPU, as the limit's), written as Parquet."""
    import daft.functions as F

    import w7 as w

    shutil.rmtree(args.output, ignore_errors=True)

    @daft.cls(max_concurrency=1)
    class Scorer:
        def __init__(self):
            self.session = w.session()

        @daft.method.batch(return_dtype=daft.DataType.fixed_size_list(daft.DataType.float32(), w.W7_CLASSES), batch_size=w.W7_BATCH_ROWS)
        def __call__(self, images: daft.Series):
            pixels = normalise(np.stack(images.to_pylist()))
            scores = self.session.run(["scores"], {"pixels": pixels})[0]
            return pa.FixedSizeListArray.from_arrays(pa.array(scores.ravel()), w.W7_CLASSES)

    started = time.perf_counter()
    df = daft.from_glob_path(os.path.join(w.W7_DIR, "images", "*.jpg"))
    image = F.resize(F.decode_image(F.download(df["path"]), mode="RGB"), w.W7_SIDE, w.W7_SIDE)
    df = df.select(df["path"], Scorer()(image).alias("scores"))
    df.write_parquet(args.output)
    wall = time.perf_counter() - started
    ids, scores = w.read_scores(args.output)
    correct = w.own_check(ids, scores)
    line("daft", "w7", "onnxruntime", wall, len(ids), 0, correct, images_per_s=round(len(ids) / wall, 3))


if __name__ == "__main__":
    main({"w3": w3, "w4": w4, "w7": w7}, "out/w4-daft")
