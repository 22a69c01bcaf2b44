"""S1 (docs/workloads.md): sort 40 million rows of a 10-byte random key and
a 90-byte random payload (4 GB) by key and write them as Parquet, in
streambatch (store capped at 512 MiB), DuckDB (memory_limit 1GB), Polars,
Ray Data (a 1 GiB object store) and Daft.

    python tools/bench/s1.py make DIR [ROWS]     # DIR/input: 40 Parquet files; DIR/rows.txt
    python tools/bench/s1.py run SYSTEM DIR      # sorts into DIR/out-SYSTEM, checks, prints one JSON line

Every system's output is checked the same way: each file's keys in order,
the files' key ranges one after another (ordered by their first key), the
row count, and a checksum of all rows (the wrapping sum of each key's and
each payload's first 8 bytes read as a little-endian integer) equal to the
input's. A run whose output fails any of these is not correct.
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import time

FILES = 40
ROWS = 40_000_000


def rows_made(dir):
    with open(os.path.join(dir, "rows.txt")) as f:
        return int(f.read())


def make(dir, rows=ROWS):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = os.path.join(dir, "input")
    if os.path.exists(os.path.join(dir, "rows.txt")) and rows_made(dir) == rows:
        return
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    rng = np.random.default_rng(1)
    for f in range(FILES):
        n = (f + 1) * rows // FILES - f * rows // FILES
        key = pa.FixedSizeBinaryArray.from_buffers(pa.binary(10), n, [None, pa.py_buffer(rng.bytes(10 * n))])
        payload = pa.FixedSizeBinaryArray.from_buffers(pa.binary(90), n, [None, pa.py_buffer(rng.bytes(90 * n))])
        tmp = os.path.join(out, f".part-{f:02d}.parquet.tmp")
        pq.write_table(pa.table({"key": key, "payload": payload}), tmp, row_group_size=250_000, compression="snappy")
        os.rename(tmp, os.path.join(out, f"part-{f:02d}.parquet"))
    for stale in ("rows.txt", "checksum.json"):
        if os.path.exists(os.path.join(dir, stale)):
            os.remove(os.path.join(dir, stale))
    with open(os.path.join(dir, "rows.txt"), "w") as f:
        f.write(str(rows))


def checksum_of(table):
    """The wrapping sum of the first 8 bytes of each key and payload;
    None where a value is not of its column's width."""
    import numpy as np
    import pyarrow as pa

    total = np.uint64(0)
    for name, width in (("key", 10), ("payload", 90)):
        for chunk in table.column(name).chunks:
            if len(chunk) == 0:
                continue
            if pa.types.is_fixed_size_binary(chunk.type):
                raw = np.frombuffer(chunk.buffers()[1], dtype=np.uint8)
                raw = raw[chunk.offset * width : (chunk.offset + len(chunk)) * width]
            else:  # binary or large_binary (as DuckDB and others write it): values of `width` bytes
                offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int64 if "large" in str(chunk.type) else np.int32)
                start, end = offsets[chunk.offset], offsets[chunk.offset + len(chunk)]
                if end - start != width * len(chunk):
                    return None
                raw = np.frombuffer(chunk.buffers()[2], dtype=np.uint8)[start:end]
            raw = raw.reshape(-1, width)
            with np.errstate(over="ignore"):  # the sum wraps, as intended
                total += np.ascontiguousarray(raw[:, :8]).view(np.uint64).sum(dtype=np.uint64)
    return int(total)


def check(files):
    """(rows, checksum, in order) of the output files, read a batch at a
    time (so that checking a 4 GB file holds only a batch)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, total, ranges, ordered = 0, 0, [], True
    for path in files:
        first = last = None
        for batch in pq.ParquetFile(path).iter_batches(batch_size=65_536):
            if batch.num_rows == 0:
                continue
            keys = batch.column(batch.schema.names.index("key")).to_pylist()
            if last is not None and last > keys[0]:
                ordered = False
            ordered = ordered and all(a <= b for a, b in zip(keys, keys[1:]))
            first = keys[0] if first is None else first
            last = keys[-1]
            rows += batch.num_rows
            part = checksum_of(pa.Table.from_batches([batch]))
            if part is None:  # a value of another width
                return rows, None, False
            total = (total + part) % (1 << 64)
        if first is not None:
            ranges.append((first, last))
    ranges.sort()
    ordered = ordered and all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))
    return rows, total, ordered


def expected(dir):
    path = os.path.join(dir, "checksum.json")
    if not os.path.exists(path):
        rows, total, _ = check(sorted(glob.glob(os.path.join(dir, "input", "*.parquet"))))
        with open(path, "w") as f:
            json.dump({"rows": rows, "checksum": total}, f)
    with open(path) as f:
        e = json.load(f)
    return e["rows"], e["checksum"]


def run_streambatch(inp, out):
    # `streambatch bench s1` reads data/s1/input, writes data/s1/out-streambatch.
    assert inp == os.path.abspath("data/s1/input") and out == os.path.abspath("data/s1/out-streambatch"), (inp, out)
    binary = os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "streambatch")
    line = subprocess.run([binary, "bench", "s1"], check=True, capture_output=True, text=True).stdout
    return json.loads(line.strip().splitlines()[-1])


def run_streambatch_cluster(inp, out):
    # `streambatch bench s1-cluster`: 3 nodes, a clean run, then one node
    # SIGKILLed mid-exchange; its second run writes data/s1/out-streambatch-cluster.
    assert inp == os.path.abspath("data/s1/input") and out == os.path.abspath("data/s1/out-streambatch-cluster"), (inp, out)
    binary = os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "streambatch")
    line = subprocess.run([binary, "bench", "s1-cluster"], check=True, capture_output=True, text=True).stdout
    return json.loads(line.strip().splitlines()[-1])


def run_duckdb(inp, out):
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads = 2")
    con.execute("SET memory_limit = '1GB'")
    con.execute(f"SET temp_directory = '{out}.tmp'")
    os.makedirs(out)
    con.execute(f"COPY (SELECT * FROM read_parquet('{inp}/*.parquet') ORDER BY key) TO '{out}/sorted.parquet' (FORMAT parquet)")
    shutil.rmtree(f"{out}.tmp", ignore_errors=True)


def run_polars(inp, out):
    import polars as pl

    os.makedirs(out)
    pl.scan_parquet(f"{inp}/*.parquet").sort("key").sink_parquet(f"{out}/sorted.parquet")


def run_ray(inp, out):
    import ray

    ray.init(num_cpus=2, object_store_memory=1 << 30, include_dashboard=False, log_to_driver=False)
    ray.data.read_parquet(inp).sort("key").write_parquet(out)


def run_daft(inp, out):
    import daft

    # Daft 0.7.26 sorts neither fixed-size binary ("not yet implemented:
    # impl argsort for FixedSizeBinaryArray") nor binary ("Cannot sort on
    # expression col(key) with type: Binary"): this run fails, as it is.
    daft.read_parquet(f"{inp}/*.parquet").sort("key").write_parquet(out)


SYSTEMS = {
    "streambatch": run_streambatch,
    "streambatch-cluster": run_streambatch_cluster,
    "duckdb": run_duckdb,
    "polars": run_polars,
    "ray-data": run_ray,
    "daft": run_daft,
}


def main():
    if sys.argv[1] == "make":
        make(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else ROWS)
        return
    system, dir = sys.argv[2], os.path.abspath(sys.argv[3])
    os.environ.setdefault("POLARS_MAX_THREADS", "2")
    inp, out = os.path.join(dir, "input"), os.path.join(dir, f"out-{system}")
    shutil.rmtree(out, ignore_errors=True)
    want_rows, want_sum = expected(dir)
    started = time.perf_counter()
    own = SYSTEMS[system](inp, out) or {}
    wall = own.get("wall_s") or time.perf_counter() - started
    rows, total, ordered = check(sorted(glob.glob(os.path.join(out, "**", "*.parquet"), recursive=True)))
    shutil.rmtree(out, ignore_errors=True)
    print(
        json.dumps(
            {
                **own,
                "workload": "s1",
                "system": system,
                "config": f"{want_rows:,} rows of 100 bytes",
                "wall_s": round(wall, 3),
                "rows": rows,
                "rows_per_s": round(rows / wall, 3),
                "in_order": ordered,
                "checksum_equal": total == want_sum,
                "correct": ordered and rows == want_rows and total == want_sum and own.get("correct", True) is True,
            }
        )
    )


if __name__ == "__main__":
    main()
