#!/usr/bin/env python3
"""Independent GGUF reader/writer for the weight-file tests, built on the `gguf` package
(pip install gguf), which llama.cpp maintains.

  gguf_oracle.py read FILE OUTDIR [TENSOR...]   read FILE with gguf.GGUFReader
  gguf_oracle.py write FILE OUTDIR              write FILE with gguf.GGUFWriter

Both leave OUTDIR/summary.json (metadata with GGUF value types, tensors with type, shape in
PyTorch order and a file of float32 values dequantized by gguf.quants) and OUTDIR/t<i>.f32.
"""
import json
import pathlib
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V


def save(out, i, values):
    name = f"t{i}.f32"
    np.asarray(values, dtype="<f4").tofile(out / name)
    return name


def cmd_read(path, out, only):
    r = gguf.GGUFReader(path)
    md = {}
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue
        md[key] = {"types": [t.name for t in field.types], "value": field.contents()}
    tensors = []
    for i, t in enumerate(r.tensors):
        if only and t.name not in only:
            continue
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = [int(d) for d in reversed(t.shape.tolist())]  # GGUF order is innermost first
        tensors.append({"name": t.name, "type": t.tensor_type.name, "shape": shape, "file": save(out, i, values),
                        "data_offset": int(t.data_offset)})
    summary = {"alignment": int(r.alignment), "metadata": md, "tensors": tensors}
    (out / "summary.json").write_text(json.dumps(summary))


def f16_bytes(values):
    return np.asarray(values, dtype=np.float16).view(np.uint8).reshape(-1, 2)


def cmd_write(path, out):
    rng = np.random.default_rng(20240607)
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_custom_alignment(64)
    md = {}

    def kv(key, value, vtype, sub_type=None):
        w.add_key_value(key, value, vtype, sub_type=sub_type)
        md[key] = {"type": vtype.name, "sub_type": sub_type.name if sub_type else None, "value": value}

    kv("test.u8", 200, V.UINT8)
    kv("test.i8", -100, V.INT8)
    kv("test.u16", 60000, V.UINT16)
    kv("test.i16", -30000, V.INT16)
    kv("test.u32", 4000000000, V.UINT32)
    kv("test.i32", -2000000000, V.INT32)
    kv("test.u64", 2**40 + 3, V.UINT64)
    kv("test.i64", -(2**40) - 7, V.INT64)
    kv("test.f32", float(np.float32(0.1)), V.FLOAT32)
    kv("test.f64", 0.1, V.FLOAT64)
    kv("test.bool", True, V.BOOL)
    kv("test.string", "h\u00e9llo w\u00f6rld", V.STRING)
    kv("test.arr_i32", [1, -2, 3], V.ARRAY, V.INT32)
    kv("test.arr_f32", [0.5, -1.25, 3.0], V.ARRAY, V.FLOAT32)
    kv("test.arr_str", ["a", "", "c\u00e7"], V.ARRAY, V.STRING)
    kv("test.arr_bool", [True, False], V.ARRAY, V.BOOL)
    kv("test.nested", [[1, 2], [3]], V.ARRAY)

    tensors = []

    def add(name, qtype, shape, raw, values):
        w.add_tensor(name, raw, raw_dtype=qtype)
        tensors.append({"name": name, "type": qtype.name, "shape": list(shape),
                        "file": save(out, len(tensors), values)})

    x = rng.standard_normal((4, 64)).astype(np.float32)
    add("f32", Q.F32, x.shape, x, x)
    add("f16", Q.F16, x.shape, x.astype(np.float16), x.astype(np.float16).astype(np.float32))
    for qtype in (Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1):
        y = (rng.standard_normal((3, 96)) * rng.uniform(0.01, 3.0)).astype(np.float32)
        raw = gguf.quants.quantize(y, qtype)
        add(qtype.name.lower(), qtype, y.shape, raw, gguf.quants.dequantize(raw, qtype))
    # k-quants: the package only decodes them, so random blocks with sane f16 scales.
    for qtype, block_bytes, scale_at in ((Q.Q4_K, 144, (0, 2)), (Q.Q6_K, 210, (208,)), (Q.Q5_K, 176, (0, 2))):
        rows, blocks_per_row = 2, 2
        raw = rng.integers(0, 256, size=(rows * blocks_per_row, block_bytes), dtype=np.uint8)
        for at in scale_at:
            raw[:, at:at + 2] = f16_bytes(rng.uniform(-0.2, 0.2, size=rows * blocks_per_row))
        raw = raw.reshape(rows, blocks_per_row * block_bytes)
        add(qtype.name.lower(), qtype, (rows, blocks_per_row * 256), raw, gguf.quants.dequantize(raw, qtype))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (out / "summary.json").write_text(json.dumps({"alignment": 64, "metadata": md, "tensors": tensors}))


def main():
    if len(sys.argv) < 4 or sys.argv[1] not in ("read", "write"):
        sys.exit(__doc__)
    out = pathlib.Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    if sys.argv[1] == "read":
        cmd_read(sys.argv[2], out, set(sys.argv[4:]))
    else:
        cmd_write(sys.argv[2], out)


if __name__ == "__main__":
    main()
