"""ONNX Runtime's own answer for the tests in tests/onnx_models.rs.

Usage: reference.py MODEL.onnx IN.arrow OUT.arrow

Reads a batch (Arrow IPC file), feeds each model input from the column of
its name (fixed-size lists flattened, then shaped as the model declares,
the batch first and one dynamic dimension inferred), runs the model with
onnxruntime's CPU provider, and writes each output as a column of its name
(a fixed-size list of its per-row values where it has more than one).
"""

import sys

import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pyarrow.ipc

DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(uint8)": np.uint8,
}


def main(model, source, target):
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    with pa.ipc.open_file(source) as reader:
        table = reader.read_all()
    rows = table.num_rows
    feeds = {}
    for i in session.get_inputs():
        values = table.column(i.name).combine_chunks()
        while pa.types.is_fixed_size_list(values.type):
            values = values.flatten()
        array = values.to_numpy(zero_copy_only=False).astype(DTYPES[i.type])
        shape = [rows] + [d if isinstance(d, int) else -1 for d in i.shape[1:]]
        feeds[i.name] = array.reshape(shape)
    outputs = session.run(None, feeds)
    columns, names = [], []
    for o, value in zip(session.get_outputs(), outputs):
        flat = pa.array(value.reshape(-1))
        width = int(np.prod(value.shape[1:])) if value.ndim > 1 else 1
        column = flat if value.ndim == 1 else pa.FixedSizeListArray.from_arrays(flat, width)
        columns.append(column)
        names.append(o.name)
    out = pa.table(columns, names=names)
    with pa.ipc.new_file(target, out.schema) as writer:
        writer.write_table(out)


if __name__ == "__main__":
    main(*sys.argv[1:4])
