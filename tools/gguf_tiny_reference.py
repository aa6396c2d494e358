#!/usr/bin/env python3
"""A tiny GGUF written by llama.cpp's own gguf-py writer, and what gguf-py's reader says about it.

Owns: crates/formats/tests/fixtures/gguf_tiny.gguf, crates/formats/tests/fixtures/gguf_tiny.json

The file carries one metadata key of every value type (arrays of numbers, strings and arrays
included), a custom general.alignment of 64, and three tensors (f32 [2,3], f16 [5], q8_0 two
blocks). The JSON lists, from gguf.GGUFReader: every key with its type name and value, and
every tensor's name, dims (GGUF order), ggml type id, absolute data offset, byte count and
(float tensors) element values.
crates/formats/tests/gguf_errors.rs checks cortiq's reader against both.

Pinned: gguf==0.19.0 (+ numpy).
    python3 -m venv /tmp/v && /tmp/v/bin/pip install gguf==0.19.0
    /tmp/v/bin/python tools/gguf_tiny_reference.py
"""

import json
from pathlib import Path

import numpy as np
import gguf
from gguf import GGUFValueType as T

OUT = Path(__file__).resolve().parent.parent / "crates/formats/tests/fixtures"


def write(path):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_custom_alignment(64)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 1.5)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo wörld")
    w.add_uint64("t.u64", 2**64 - 2)
    w.add_int64("t.i64", -(2**63))
    w.add_float64("t.f64", -0.1)
    w.add_key_value("t.arr_i32", [1, -2, 3], T.ARRAY, sub_type=T.INT32)
    w.add_key_value("t.arr_f32", [0.5, -1.25], T.ARRAY, sub_type=T.FLOAT32)
    w.add_array("t.arr_str", ["a", "", "ccc"])
    w.add_tensor("a", np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5 - 1)
    w.add_tensor("h", np.array([1, -2, 0.5, 65504, -0.0], dtype=np.float16))
    q8 = np.arange(68, dtype=np.uint8).reshape(2, 34)
    w.add_tensor("q", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def value(field):
    t = field.types[0]
    if t == T.ARRAY:
        sub = field.types[1] if len(field.types) > 1 else None
        if sub == T.STRING:
            vals = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        else:
            vals = [field.parts[i].tolist()[0] for i in field.data]
        return {"type": "array", "sub_type": sub.name.lower() if sub is not None else None, "value": vals}
    if t == T.STRING:
        return {"type": "string", "value": bytes(field.parts[field.data[0]]).decode("utf-8")}
    return {"type": t.name.lower(), "value": field.parts[field.data[0]].tolist()[0]}


def main():
    path = OUT / "gguf_tiny.gguf"
    write(path)
    r = gguf.GGUFReader(str(path))
    kv = {name: value(f) for name, f in r.fields.items() if not name.startswith("GGUF.")}
    tensors = [
        {
            "name": t.name,
            "dims": [int(x) for x in t.shape],
            "ggml_type": int(t.tensor_type),
            "offset": int(t.data_offset),
            "n_bytes": int(t.n_bytes),
            # Element values as gguf-py reads them (float tensors only).
            "values": [float(x) for x in np.asarray(t.data).ravel()] if int(t.tensor_type) in (0, 1) else None,
        }
        for t in r.tensors
    ]
    doc = {"version": int(r.fields["GGUF.version"].parts[-1][0]), "alignment": int(r.alignment), "kv": kv, "tensors": tensors,
           "file_size": path.stat().st_size}
    (OUT / "gguf_tiny.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(path, path.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
