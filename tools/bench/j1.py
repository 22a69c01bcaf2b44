"""J1 (docs/workloads.md): TPC-H-shaped `lineitem` (6 million rows) joined
with `orders` (1.5 million) on the order key, then revenue aggregated by
the order's priority, read from Parquet, in DuckDB, Polars, Ray Data and
Daft.

    python tools/bench/j1.py make DIR          # lineitem/ and orders/, Parquet
    python tools/bench/j1.py run SYSTEM DIR    # prints one JSON line

The tables follow TPC-H's shapes at scale factor 1: 1.5 million orders with
sparse keys (8 keys to every 32, as dbgen spaces them), each with 1 to 7
line items (6 million in all, in no order), a priority among TPC-H's five;
a line item's extended price is uniform in [900, 105,000) and its discount
in 0.00..0.10. The query:

    SELECT o_orderpriority, count(*), sum(l_extendedprice * (1 - l_discount))
    FROM lineitem JOIN orders ON l_orderkey = o_orderkey
    GROUP BY o_orderpriority

Its answer is checked by its checksum (groups, then the sum over the
groups of each aggregate column; the harness compares every system's with
DuckDB's; a NaN never matches).
"""

import json
import math
import os
import sys
import time

ORDERS = 1_500_000
LINEITEM_FILES = 8
ORDERS_FILES = 4
PRIORITIES = ["1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW"]


def make(dir):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    if os.path.exists(os.path.join(dir, "orders", f"part-{ORDERS_FILES - 1}.parquet")):
        return
    rng = np.random.default_rng(2025)
    # dbgen's sparse keys: the first 8 of every 32.
    keys = (np.arange(ORDERS) // 8) * 32 + np.arange(ORDERS) % 8 + 1
    priority = np.array(PRIORITIES)[rng.integers(0, 5, ORDERS)]
    lines = rng.integers(1, 8, ORDERS)
    l_orderkey = np.repeat(keys, lines)
    order = rng.permutation(len(l_orderkey))
    l_orderkey = l_orderkey[order]
    n = len(l_orderkey)
    lineitem = {
        "l_orderkey": l_orderkey.astype(np.int64),
        "l_quantity": rng.integers(1, 51, n).astype(np.float64),
        "l_extendedprice": np.round(rng.uniform(900, 105_000, n), 2),
        "l_discount": rng.integers(0, 11, n) / 100.0,
    }
    shuffled = rng.permutation(ORDERS)
    orders = {
        "o_orderkey": keys[shuffled].astype(np.int64),
        "o_orderpriority": priority[shuffled],
        "o_totalprice": np.round(rng.uniform(900, 500_000, ORDERS), 2),
    }
    for name, table, files in [("lineitem", lineitem, LINEITEM_FILES), ("orders", orders, ORDERS_FILES)]:
        out = os.path.join(dir, name)
        os.makedirs(out, exist_ok=True)
        rows = len(next(iter(table.values())))
        for f in range(files):
            lo, hi = f * rows // files, (f + 1) * rows // files
            part = pa.table({k: pa.array(v[lo:hi]) for k, v in table.items()})
            tmp = os.path.join(out, f".part-{f}.parquet.tmp")
            pq.write_table(part, tmp, row_group_size=(hi - lo + 1) // 2)
            os.rename(tmp, os.path.join(out, f"part-{f}.parquet"))


def checksum(groups, columns):
    """[groups, sum of each aggregate column] as floats."""
    return [float(groups)] + [float(sum(c)) for c in columns]


def duckdb_answer(dir):
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads = 2")
    row = con.execute(
        f"""SELECT count(*), sum(n), sum(revenue) FROM (
              SELECT o_orderpriority, count(*) AS n,
                     sum(l_extendedprice * (1 - l_discount)) AS revenue
              FROM read_parquet('{dir}/lineitem/*.parquet')
              JOIN read_parquet('{dir}/orders/*.parquet') ON l_orderkey = o_orderkey
              GROUP BY o_orderpriority)"""
    ).fetchone()
    return [float(x) for x in row]


def polars_answer(dir):
    import polars as pl

    lineitem = pl.scan_parquet(f"{dir}/lineitem/*.parquet")
    orders = pl.scan_parquet(f"{dir}/orders/*.parquet")
    df = (
        lineitem.with_columns((pl.col("l_extendedprice") * (1 - pl.col("l_discount"))).alias("revenue"))
        .join(orders, left_on="l_orderkey", right_on="o_orderkey")
        .group_by("o_orderpriority")
        .agg(pl.len().alias("n"), pl.col("revenue").sum())
        .collect()
    )
    return checksum(df.height, [df["n"].to_list(), df["revenue"].to_list()])


def ray_answer(dir):
    import ray
    from ray.data.aggregate import Count, Sum

    ray.init(num_cpus=2, object_store_memory=1 << 30, include_dashboard=False, log_to_driver=False)
    lineitem = ray.data.read_parquet(f"{dir}/lineitem", columns=["l_orderkey", "l_extendedprice", "l_discount"])
    lineitem = lineitem.map_batches(
        lambda b: {"l_orderkey": b["l_orderkey"], "revenue": b["l_extendedprice"] * (1 - b["l_discount"])},
        batch_format="numpy",
    )
    orders = ray.data.read_parquet(f"{dir}/orders", columns=["o_orderkey", "o_orderpriority"])
    joined = lineitem.join(orders, join_type="inner", num_partitions=8, on=("l_orderkey",), right_on=("o_orderkey",))
    tables = ray.get(joined.groupby("o_orderpriority").aggregate(Count(alias_name="n"), Sum("revenue", alias_name="revenue")).to_arrow_refs())
    groups = sum(t.num_rows for t in tables)
    columns = [[v for t in tables for v in t.column(c).to_pylist()] for c in ("n", "revenue")]
    return checksum(groups, columns)


def daft_answer(dir):
    import daft

    lineitem = daft.read_parquet(f"{dir}/lineitem/*.parquet")
    orders = daft.read_parquet(f"{dir}/orders/*.parquet")
    revenue = (daft.col("l_extendedprice") * (1 - daft.col("l_discount"))).alias("revenue")
    table = (
        lineitem.with_column("revenue", revenue)
        .join(orders, left_on="l_orderkey", right_on="o_orderkey")
        .groupby("o_orderpriority")
        .agg(daft.col("l_orderkey").count().alias("n"), daft.col("revenue").sum().alias("revenue"))
        .to_arrow()
    )
    return checksum(table.num_rows, [table.column("n").to_pylist(), table.column("revenue").to_pylist()])


SYSTEMS = {
    "duckdb": duckdb_answer,
    "polars": polars_answer,
    "ray-data": ray_answer,
    "daft": daft_answer,
}


def main():
    if sys.argv[1] == "make":
        make(sys.argv[2])
        return
    system, dir = sys.argv[2], sys.argv[3]
    os.environ.setdefault("POLARS_MAX_THREADS", "2")
    started = time.perf_counter()
    answer = SYSTEMS[system](os.path.abspath(dir))
    wall = time.perf_counter() - started
    rows = int(answer[1]) if math.isfinite(answer[1]) else 0
    print(
        json.dumps(
            {
                "workload": "j1",
                "system": system,
                "config": "lineitem 6M x orders 1.5M, revenue by priority",
                "wall_s": round(wall, 3),
                "rows": rows,
                "rows_per_s": round(rows / wall, 3),
                "checksums": [answer],
                "correct": all(math.isfinite(x) for x in answer) and answer[0] == 5,
            }
        )
    )


if __name__ == "__main__":
    main()
