"""G1 (docs/workloads.md): the H2O db-benchmark's groupby questions 1-5 on
its 10-million-row table G1_1e7_1e2_0_0, read from Parquet, in DuckDB,
Polars, Ray Data and Daft.

    python tools/bench/g1.py make DIR          # the table, as 8 Parquet files
    python tools/bench/g1.py run SYSTEM DIR    # prints one JSON line

The table follows the benchmark's generator (groupby-datagen.R) column by
column: id1, id2 of K = 100 strings "id001"..; id3 of N/K strings
"id0000000001"..; id4, id5 integers 1..K; id6 integers 1..N/K; v1 in 1..5,
v2 in 1..15, v3 uniform in [0, 100) rounded to 6 places; no nulls,
unsorted. Seeded here (the R script draws with R's generator).

Each question's answer is checked by its checksum: the number of groups
and, per aggregate column, the sum over the groups (the harness compares
every system's with DuckDB's; a NaN never matches).
"""

import json
import math
import os
import sys
import time

N = 10_000_000
K = 100
FILES = 8

# (keys, [(aggregate, column)]) per question, in the benchmark's order.
QUESTIONS = [
    (["id1"], [("sum", "v1")]),
    (["id1", "id2"], [("sum", "v1")]),
    (["id3"], [("sum", "v1"), ("mean", "v3")]),
    (["id4"], [("mean", "v1"), ("mean", "v2"), ("mean", "v3")]),
    (["id6"], [("sum", "v1"), ("sum", "v2"), ("sum", "v3")]),
]


def make(dir):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    if os.path.exists(os.path.join(dir, f"part-{FILES - 1}.parquet")):
        return
    os.makedirs(dir, exist_ok=True)
    rng = np.random.default_rng(2024)
    small = np.array([f"id{i:03d}" for i in range(1, K + 1)])
    large = np.array([f"id{i:010d}" for i in range(1, N // K + 1)])
    per = N // FILES
    for f in range(FILES):
        table = pa.table(
            {
                "id1": pa.array(small[rng.integers(0, K, per)]),
                "id2": pa.array(small[rng.integers(0, K, per)]),
                "id3": pa.array(large[rng.integers(0, N // K, per)]),
                "id4": pa.array(rng.integers(1, K + 1, per, dtype=np.int32)),
                "id5": pa.array(rng.integers(1, K + 1, per, dtype=np.int32)),
                "id6": pa.array(rng.integers(1, N // K + 1, per, dtype=np.int32)),
                "v1": pa.array(rng.integers(1, 6, per, dtype=np.int32)),
                "v2": pa.array(rng.integers(1, 16, per, dtype=np.int32)),
                "v3": pa.array(np.round(rng.uniform(0, 100, per), 6)),
            }
        )
        tmp = os.path.join(dir, f".part-{f}.parquet.tmp")
        pq.write_table(table, tmp, row_group_size=per // 2)
        os.rename(tmp, os.path.join(dir, f"part-{f}.parquet"))


def checksum(groups, columns):
    """[groups, sum of each aggregate column] as floats."""
    return [float(groups)] + [float(sum(c)) for c in columns]


def name(agg, col):
    return f"{agg}_{col}"


def duckdb_answers(dir):
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads = 2")
    out = []
    for keys, aggs in QUESTIONS:
        select = ", ".join(f"{'avg' if a == 'mean' else a}({c}) AS {name(a, c)}" for a, c in aggs)
        sums = ", ".join(f"sum({name(a, c)})" for a, c in aggs)
        q = (
            f"SELECT count(*), {sums} FROM (SELECT {', '.join(keys)}, {select} "
            f"FROM read_parquet('{dir}/*.parquet') GROUP BY {', '.join(keys)})"
        )
        row = con.execute(q).fetchone()
        out.append([float(x) for x in row])
    return out


def polars_answers(dir):
    import polars as pl

    out = []
    for keys, aggs in QUESTIONS:
        exprs = [getattr(pl.col(c), a)().alias(name(a, c)) for a, c in aggs]
        df = pl.scan_parquet(f"{dir}/*.parquet").group_by(keys).agg(exprs).collect()
        out.append(checksum(df.height, [df[name(a, c)].to_list() for a, c in aggs]))
    return out


def ray_answers(dir):
    import ray
    from ray.data.aggregate import Mean, Sum

    ray.init(num_cpus=2, object_store_memory=1 << 30, include_dashboard=False, log_to_driver=False)
    out = []
    for keys, aggs in QUESTIONS:
        cols = keys + sorted({c for _, c in aggs})
        ds = ray.data.read_parquet(dir, columns=cols)
        made = [(Sum if a == "sum" else Mean)(c, alias_name=name(a, c)) for a, c in aggs]
        table = ds.groupby(keys).aggregate(*made).to_arrow_refs()
        tables = ray.get(table)
        groups = sum(t.num_rows for t in tables)
        columns = [[v for t in tables for v in t.column(name(a, c)).to_pylist()] for a, c in aggs]
        out.append(checksum(groups, columns))
    return out


def daft_answers(dir):
    import daft

    out = []
    for keys, aggs in QUESTIONS:
        df = daft.read_parquet(f"{dir}/*.parquet")
        exprs = [getattr(daft.col(c), a)().alias(name(a, c)) for a, c in aggs]
        table = df.groupby(*keys).agg(*exprs).to_arrow()
        out.append(checksum(table.num_rows, [table.column(name(a, c)).to_pylist() for a, c in aggs]))
    return out


SYSTEMS = {
    "duckdb": duckdb_answers,
    "polars": polars_answers,
    "ray-data": ray_answers,
    "daft": daft_answers,
}


def finite(answers):
    return all(math.isfinite(x) for a in answers for x in a) and all(a[0] > 0 for a in answers)


def main():
    if sys.argv[1] == "make":
        make(sys.argv[2])
        return
    system, dir = sys.argv[2], sys.argv[3]
    os.environ.setdefault("POLARS_MAX_THREADS", "2")
    started = time.perf_counter()
    answers = SYSTEMS[system](os.path.abspath(dir))
    wall = time.perf_counter() - started
    print(
        json.dumps(
            {
                "workload": "g1",
                "system": system,
                "config": "G1_1e7_1e2_0_0, questions 1-5",
                "wall_s": round(wall, 3),
                "rows": N * len(QUESTIONS),
                "rows_per_s": round(N * len(QUESTIONS) / wall, 3),
                "checksums": answers,
                "correct": finite(answers),
            }
        )
    )


if __name__ == "__main__":
    main()
