"""Writes the Parquet corpus that tests/parquet_corpus.rs reads.

Every file holds the same table (every physical and logical type, nested
lists, structs and maps, nulls in every column) written with pyarrow in one
combination of codec x dictionary x data page version, in several row groups;
a few more files cover INT96 timestamps, decimals stored as integers, the
DELTA and BYTE_STREAM_SPLIT encodings and an empty file. Beside each group
of files lies the table written, as an Arrow IPC file (`*.expected.arrow`;
timestamp[s] as timestamp[ms], the finest unit Parquet holds), and every
file is checked here to read back in pyarrow with those values (pyarrow
gives date64 as date32, the values equal); for INT96 it is what pyarrow
reads. The test compares
streambatch's values with the expected files.

Run with the benchmark environment's Python (tools/bench/run.sh makes it):
    .venv-bench/bin/python tools/corpus/parquet_corpus.py
"""

import datetime as dt
import decimal
import pathlib
import shutil

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

OUT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "parquet"
ROWS = 100
ROW_GROUP_ROWS = 40  # three row groups per file
CODECS = ["none", "snappy", "gzip", "brotli", "lz4", "zstd"]


def nullable(values, every=7):
    """`values` with every `every`-th one null."""
    return [None if i % every == 3 else v for i, v in enumerate(values)]


def column(type_, values, every=7):
    return pa.array(nullable(values, every), type=type_)


def table():
    n = range(ROWS)
    epoch = dt.datetime(2024, 2, 29, 12, 30, 15, 123456)
    columns = {
        "bool": column(pa.bool_(), [i % 3 == 0 for i in n]),
        "i8": column(pa.int8(), [(i * 37) % 256 - 128 for i in n]),
        "i16": column(pa.int16(), [i * 211 - 16000 for i in n]),
        "i32": column(pa.int32(), [i * 1_000_003 - 2**31 + 7 for i in n]),
        "i64": column(pa.int64(), [i * 61_000_000_000_003 - 2**62 for i in n]),
        "u8": column(pa.uint8(), [(i * 53) % 256 for i in n]),
        "u16": column(pa.uint16(), [(i * 433) % 65536 for i in n]),
        "u32": column(pa.uint32(), [(i * 28_629_151) % 2**32 for i in n]),
        "u64": column(pa.uint64(), [(i * 122_978_293_824_730_344) % 2**64 for i in n]),
        "f16": column(pa.float16(), [i / 8 - 4 for i in n]),
        "f32": column(pa.float32(), [i * 0.25 - 7.5 for i in n]),
        "f64": column(pa.float64(), [i * 1e-3 - 1e6 if i % 11 else float("inf") for i in n]),
        "dec_7_2": column(pa.decimal128(7, 2), [decimal.Decimal(i * 1337 - 99_999) / 100 for i in n]),
        "dec_15_3": column(pa.decimal128(15, 3), [decimal.Decimal(i * 10**11 + 1) / 1000 for i in n]),
        "dec_30_5": column(pa.decimal128(30, 5), [decimal.Decimal(-(10**28) + i * 7**30) / 10**5 for i in n]),
        "dec_50_10": column(pa.decimal256(50, 10), [decimal.Decimal(10**45 + i * 3**60) / 10**10 for i in n]),
        "date32": column(pa.date32(), [dt.date(1969, 7, 20) + dt.timedelta(days=i * 97) for i in n]),
        "date64": column(pa.date64(), [dt.date(2000, 1, 1) + dt.timedelta(days=i * 13) for i in n]),
        "time32_ms": column(pa.time32("ms"), [(i * 577_123) % 86_400_000 for i in n]),
        "time64_us": column(pa.time64("us"), [(i * 577_123_456) % 86_400_000_000 for i in n]),
        "time64_ns": column(pa.time64("ns"), [(i * 577_123_456_789) % 86_400_000_000_000 for i in n]),
        "ts_s": column(pa.timestamp("s"), [epoch + dt.timedelta(seconds=i * 86_461) for i in n]),
        "ts_ms": column(pa.timestamp("ms"), [epoch + dt.timedelta(milliseconds=i * 3_600_001) for i in n]),
        "ts_us": column(pa.timestamp("us"), [epoch + dt.timedelta(microseconds=i * 999_999_937) for i in n]),
        "ts_ns": column(pa.timestamp("ns"), [1_709_209_815_123_456_789 + i * 86_400_000_000_007 for i in n]),
        "ts_us_utc": column(pa.timestamp("us", tz="UTC"), [i * 31_536_000_000_001 for i in n]),
        "ts_ms_paris": column(pa.timestamp("ms", tz="Europe/Paris"), [i * 2_629_800_001 for i in n]),
        "duration_ms": column(pa.duration("ms"), [i * 90_061_001 - 10**9 for i in n]),
        "string": column(pa.string(), [f"row {i} ü{'é' * (i % 5)}" for i in n]),
        "large_string": column(pa.large_string(), ["x" * (i % 40) for i in n]),
        "binary": column(pa.binary(), [bytes([i % 256, 0, 255]) * (i % 4) for i in n]),
        "large_binary": column(pa.large_binary(), [bytes(range(i % 17)) for i in n]),
        "fixed_binary": column(pa.binary(5), [i.to_bytes(5, "little") for i in n]),
        "dict_string": pa.array(
            nullable([["red", "green", "blue", "ochre"][i % 4] for i in n]),
            type=pa.string(),
        ).dictionary_encode(),
        "nulls": pa.nulls(ROWS),
        # Parquet's UUID and JSON logical types (Arrow extension types).
        "uuid": pa.ExtensionArray.from_storage(
            pa.uuid(), column(pa.binary(16), [(i * 0x9E3779B97F4A7C15).to_bytes(16, "big") for i in n])
        ),
        "json": pa.ExtensionArray.from_storage(
            pa.json_(), column(pa.string(), [f'{{"row": {i}, "tags": ["a", {i % 3}]}}' for i in n])
        ),
        "list_i32": column(pa.list_(pa.int32()), [list(range(i % 5)) for i in n]),
        "list_string_nulls": column(
            pa.list_(pa.string()), [[None if j == 1 else f"s{j}" for j in range(i % 4)] for i in n]
        ),
        "large_list_f64": column(pa.large_list(pa.float64()), [[j / 3 for j in range(i % 3)] for i in n]),
        # No nulls: pyarrow 25 cannot read back a null fixed-size list it wrote.
        "fixed_list_i16": pa.array([[i, -i, i * 2] for i in n], type=pa.list_(pa.int16(), 3)),
        "list_list_i64": column(
            pa.list_(pa.list_(pa.int64())), [[list(range(j)) for j in range(i % 4)] for i in n]
        ),
        "struct": column(
            pa.struct([("a", pa.int32()), ("b", pa.string()), ("c", pa.list_(pa.bool_()))]),
            [{"a": i, "b": None if i % 5 == 0 else f"b{i}", "c": [i % 2 == 0] * (i % 3)} for i in n],
        ),
        "struct_of_struct": column(
            pa.struct([("inner", pa.struct([("x", pa.float64()), ("y", pa.int64())]))]),
            [{"inner": None if i % 9 == 0 else {"x": i / 2, "y": -i}} for i in n],
        ),
        "map_string_i32": column(
            pa.map_(pa.string(), pa.int32()), [[(f"k{j}", j * i) for j in range(i % 4)] for i in n]
        ),
        "list_struct": column(
            pa.list_(pa.struct([("x", pa.float64()), ("ys", pa.list_(pa.int64()))])),
            [[{"x": j * 1.5, "ys": list(range(j))} for j in range(i % 3)] for i in n],
        ),
    }
    return pa.table(columns)


def write(path, table, **options):
    pq.write_table(table, path, row_group_size=ROW_GROUP_ROWS, **options)
    back = pq.read_table(path)
    # Parquet has no date64 or timestamp[s]: pyarrow reads date32 and
    # timestamp[ms] back, with the same values.
    assert decoded(back.cast(table.schema)).equals(decoded(table)), f"{path} reads back changed"
    return back


def decoded(table):
    """`table` with dictionary columns as their values (each row group's
    dictionary differs, so the arrays do not compare equal as they are)."""
    schema = pa.schema(
        f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f
        for f in table.schema
    )
    return table.cast(schema)


def write_expected(path, table):
    """`table` as an IPC file, its timestamp[s] columns as timestamp[ms]:
    Parquet has no seconds, and both pyarrow and arrow-rs read ms."""
    schema = pa.schema(
        f.with_type(pa.timestamp("ms", f.type.tz))
        if pa.types.is_timestamp(f.type) and f.type.unit == "s"
        else f
        for f in table.schema
    )
    table = table.cast(schema)
    with ipc.new_file(path, table.schema) as writer:
        # An IPC file holds one dictionary per field: unify the row groups'.
        writer.write_table(table.unify_dictionaries().combine_chunks())


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    full = table()
    for codec in CODECS:
        for dictionary in (True, False):
            for page in ("1.0", "2.0"):
                name = f"all_types.{codec}.{'dict' if dictionary else 'plain'}.v{page[0]}.parquet"
                write(
                    OUT / name,
                    full,
                    compression=codec,
                    use_dictionary=dictionary,
                    data_page_version=page,
                )
    write_expected(OUT / "all_types.expected.arrow", full)

    # Columns in encodings other than plain and dictionary.
    encoded = full.select(["i32", "i64", "u32", "f32", "f64", "string", "binary", "fixed_binary"])
    write(
        OUT / "encodings.zstd.parquet",
        encoded,
        compression="zstd",
        use_dictionary=False,
        column_encoding={
            "i32": "DELTA_BINARY_PACKED",
            "i64": "DELTA_BINARY_PACKED",
            "u32": "BYTE_STREAM_SPLIT",
            "f32": "BYTE_STREAM_SPLIT",
            "f64": "BYTE_STREAM_SPLIT",
            "string": "DELTA_LENGTH_BYTE_ARRAY",
            "binary": "DELTA_BYTE_ARRAY",
            "fixed_binary": "BYTE_STREAM_SPLIT",
        },
    )
    write_expected(OUT / "encodings.expected.arrow", encoded)

    # Legacy INT96 timestamps (Spark, Impala), without the Arrow schema
    # that would give their units: what pyarrow reads is nanoseconds.
    stamps = full.select(["ts_ns", "ts_us", "ts_ms"])
    back = write(OUT / "int96.snappy.parquet", stamps, use_deprecated_int96_timestamps=True,
                 store_schema=False)
    write_expected(OUT / "int96.expected.arrow", back)

    # Decimals of small precision stored as INT32 / INT64 rather than bytes.
    decimals = full.select(["dec_7_2", "dec_15_3", "dec_30_5"])
    write(OUT / "decimals_as_int.gzip.parquet", decimals, compression="gzip",
                 store_decimal_as_integer=True)
    write_expected(OUT / "decimals_as_int.expected.arrow", decimals)

    # No rows at all: the schema only.
    empty = full.slice(0, 0)
    write(OUT / "empty.snappy.parquet", empty)
    write_expected(OUT / "empty.expected.arrow", empty)

    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"wrote {len(list(OUT.iterdir()))} files, {total / 1024:.0f} KiB, to {OUT}")


if __name__ == "__main__":
    main()
