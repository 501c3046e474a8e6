"""safetensors files for the reference scripts beside this one, byte by byte: the format's 8-byte header length, its
JSON header, the tensors' bytes. One reader and one writer; each script turns entries into its own arrays.

    entries, metadata = read_entries(path)   # [(name, dtype, shape, raw bytes)] in data order, {"key": "value"}
    to_float32(raw, dtype)                   # the values as a flat float32 array (F32, F16, BF16)
    to_float64(raw, dtype)                   # the same, exactly, as float64 (F64 too)
    float32_to_bytes(values, dtype)          # back: F32, F16 (NumPy's cast), BF16 (round to nearest even)
    write_entries(path, entries)             # [(name, dtype, shape, raw bytes)], the header padded to 8 bytes
"""
import json
import struct

import numpy as np

NUMPY_DTYPES = {"F32": np.float32, "F16": np.float16}


def read_entries(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    metadata = header.pop("__metadata__", {})
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    return [(name, info["dtype"], info["shape"], body[info["data_offsets"][0]:info["data_offsets"][1]])
            for name, info in entries], metadata


def to_float32(raw, dtype):
    if dtype == "BF16":  # bf16 is the top half of a float32
        return (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(raw, dtype=NUMPY_DTYPES[dtype]).astype(np.float32)


def to_float64(raw, dtype):
    if dtype == "F64":
        return np.frombuffer(raw, dtype=np.float64).copy()
    return to_float32(raw, dtype).astype(np.float64)


def float32_to_bytes(values, dtype):
    values = np.ascontiguousarray(values, dtype=np.float32)
    if dtype == "F32":
        return values.tobytes()
    if dtype == "F16":
        return values.astype(np.float16).tobytes()
    bits = values.view(np.uint32).astype(np.uint64)  # BF16: round to nearest even (values are finite)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return bits.astype(np.uint16).tobytes()


def write_entries(path, entries):
    header, blobs, offset = {}, [], 0
    for name, dtype, shape, raw in entries:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
