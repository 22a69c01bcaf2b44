"""Daft (native runner) side of the benchmark workloads, for W3 so far.
Prints one JSON line last, with the keys `streambatch bench` prints.

    python tools/bench/daft_workloads.py w3
"""

import argparse
import json
import resource
import time

import daft


@daft.func.batch(return_dtype=daft.DataType.int64())
def noop(ids: daft.Series) -> daft.Series:
    return ids


def w3(rows, partitions):
    started = time.perf_counter()
    df = daft.range(0, rows, partitions=partitions)
    count = df.select(noop(df["id"])).count_rows()
    wall = time.perf_counter() - started
    print(
        json.dumps(
            {
                "workload": "w3",
                "system": "daft",
                "config": f"rows={rows},partitions={partitions}",
                "wall_s": round(wall, 3),
                "rows_per_s": round(count / wall, 3),
                "partitions_per_s": round(partitions / wall, 3),
                "efficiency": None,
                "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 3),
                "store_peak_bytes": None,
                "spilled_bytes": None,
                "correct": count == rows,
            }
        ),
        flush=True,
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=["w3"])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=2_000)
    args = parser.parse_args()
    w3(args.rows, args.partitions)


if __name__ == "__main__":
    main()
