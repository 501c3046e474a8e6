"""Strict safetensors reading and writing, without the `safetensors` package.

The format (https://github.com/huggingface/safetensors): an 8-byte little-endian header length N, N bytes of UTF-8
JSON header, then the data section. The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin,
end]} (offsets relative to the data section) and may hold "__metadata__": {str: str}.

The reader follows Parsyn's own (src/weights/safetensors.h): every field is checked and a malformed file raises
SafetensorsError naming the file, the tensor and the rule broken (unknown dtype or field, a shape whose byte size
differs from its offsets, offsets that overlap, leave gaps, do not start at 0, or trailing bytes, duplicate keys,
non-string metadata, a header running past the end of the file). The writer lays tensors out in the order given,
contiguously from offset 0, pads the header with spaces to a multiple of 8 bytes, and writes atomically (a temporary
file in the same folder, fsync, rename), so a reader never sees half a file.

NumPy has no bfloat16: `load` widens BF16 tensors to float32 (exactly), and `save` writes float arrays as BF16 when
`dtypes` asks for it, rounding to nearest even. `load_torch`/`save_torch` keep torch.bfloat16 as it is. torch is
imported only by those two functions.

Functions here keep no state and are safe to call from several threads at once.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

__all__ = [
    "DTYPES",
    "SafetensorsError",
    "TensorInfo",
    "Header",
    "read_header",
    "layout",
    "load",
    "load_metadata",
    "save",
    "load_torch",
    "save_torch",
    "bf16_bits_to_float32",
    "float32_to_bf16_bits",
    "atomic_write",
]

# The dtypes Parsyn's reader accepts, with the NumPy dtype of their stored bytes (little-endian). BF16's bytes are
# read as uint16 bit patterns and widened to float32 by `load`.
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}

# NumPy dtype -> safetensors dtype, for arrays written without an explicit dtype.
_DTYPE_OF_NUMPY = {np.dtype(v).newbyteorder("="): k for k, v in DTYPES.items() if k != "BF16"}

MAX_HEADER_BYTES = 100 << 20  # a header longer than this is refused before it is read
_LENGTH_BYTES = 8


class SafetensorsError(ValueError):
    """A safetensors file (or a tensor to write) breaks a rule of the format; the message names it."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header describes it. begin/end are relative to the data section."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    """A checked header: the tensors in data order (they tile the data section exactly) and the metadata."""

    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_start: int  # absolute offset of the data section in the file


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise SafetensorsError(f"header has duplicate key {key!r}")
        result[key] = value
    return result


def _is_count(value: Any) -> bool:
    # JSON true/false parse as bool, which is an int subclass in Python: not a count.
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parse_entry(name: str, spec: Any) -> TensorInfo:
    where = f"tensor {name!r}"
    if not name:
        raise SafetensorsError("tensor name is empty")
    if not isinstance(spec, dict):
        raise SafetensorsError(f"{where}: entry is not an object")
    unknown = sorted(set(spec) - {"dtype", "shape", "data_offsets"})
    if unknown:
        raise SafetensorsError(f"{where}: unknown field {unknown[0]!r}")
    for field in ("dtype", "shape", "data_offsets"):
        if field not in spec:
            raise SafetensorsError(f"{where}: missing field {field!r}")
    dtype = spec["dtype"]
    if not isinstance(dtype, str):
        raise SafetensorsError(f"{where}: dtype is not a string")
    if dtype not in DTYPES:
        raise SafetensorsError(f"{where}: unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    shape = spec["shape"]
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise SafetensorsError(f"{where}: shape must be an array of non-negative integers, got {shape!r}")
    offsets = spec["data_offsets"]
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets):
        raise SafetensorsError(f"{where}: data_offsets must be an array of two non-negative integers, got {offsets!r}")
    begin, end = offsets
    if end < begin:
        raise SafetensorsError(f"{where}: data_offsets [{begin}, {end}] end before they begin")
    needed = math.prod(shape) * DTYPES[dtype].itemsize
    if end - begin != needed:
        raise SafetensorsError(
            f"{where} ({dtype}, shape {list(shape)}) needs {needed} bytes but data_offsets [{begin}, {end}] "
            f"span {end - begin}")
    return TensorInfo(dtype, tuple(shape), begin, end)


def _check_tiling(tensors: dict[str, TensorInfo], data_bytes: int) -> dict[str, TensorInfo]:
    """Returns the tensors in data order after checking they cover [0, data_bytes) without gaps or overlaps."""
    ordered = sorted(tensors.items(), key=lambda item: (item[1].begin, item[1].end, item[0]))
    cursor = 0
    previous = None
    for name, info in ordered:
        span = f"[{info.begin}, {info.end}]"
        if info.end > data_bytes:
            raise SafetensorsError(
                f"tensor {name!r}: data_offsets {span} run past the end of the data section ({data_bytes} bytes)")
        if info.begin < cursor:
            raise SafetensorsError(f"tensor {name!r}: data_offsets {span} overlap tensor {previous!r}")
        if info.begin > cursor:
            if previous is None:
                raise SafetensorsError(
                    f"tensor {name!r}: data_offsets {span} leave a gap: the first tensor must start at offset 0")
            raise SafetensorsError(
                f"tensor {name!r}: data_offsets {span} leave a gap of {info.begin - cursor} bytes after tensor "
                f"{previous!r}")
        cursor = info.end
        previous = name
    if cursor != data_bytes:
        after = f" {previous!r}" if previous is not None else ""
        raise SafetensorsError(f"{data_bytes - cursor} trailing bytes after the last tensor{after}")
    return dict(ordered)


def _parse_header(text: bytes, data_bytes: int, data_start: int) -> Header:
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SafetensorsError(f"header is not valid UTF-8 (byte {e.start} of the header)") from None
    try:
        parsed = json.loads(decoded, object_pairs_hook=_reject_duplicate_keys)
    except json.JSONDecodeError as e:
        raise SafetensorsError(f"header is not valid JSON: {e}") from None
    except RecursionError:
        raise SafetensorsError("header JSON nests too deeply") from None
    if not isinstance(parsed, dict):
        raise SafetensorsError("header is not a JSON object")
    metadata: dict[str, str] = {}
    tensors: dict[str, TensorInfo] = {}
    for key, value in parsed.items():
        if key == "__metadata__":
            if not isinstance(value, dict):
                raise SafetensorsError("__metadata__ is not an object")
            for meta_key, meta_value in value.items():
                if not isinstance(meta_value, str):
                    raise SafetensorsError(f"__metadata__ value for {meta_key!r} is not a string")
                metadata[meta_key] = meta_value
            continue
        tensors[key] = _parse_entry(key, value)
    return Header(_check_tiling(tensors, data_bytes), metadata, data_start)


def _read_header_from(file, file_size: int) -> Header:
    if file_size < _LENGTH_BYTES:
        raise SafetensorsError(f"file is {file_size} bytes, too short for the 8-byte header length")
    header_bytes = int.from_bytes(file.read(_LENGTH_BYTES), "little")
    if header_bytes > MAX_HEADER_BYTES:
        raise SafetensorsError(f"header length {header_bytes} exceeds the cap of {MAX_HEADER_BYTES} bytes")
    if header_bytes > file_size - _LENGTH_BYTES:
        raise SafetensorsError(f"header length {header_bytes} runs past the end of the file ({file_size} bytes)")
    data_start = _LENGTH_BYTES + header_bytes
    return _parse_header(file.read(header_bytes), file_size - data_start, data_start)


def _with_path(path: os.PathLike | str, error: SafetensorsError) -> SafetensorsError:
    return SafetensorsError(f"{os.fspath(path)}: {error}")


def read_header(path: os.PathLike | str) -> Header:
    """Reads and checks the header of the file at `path` (touching no tensor bytes).

    Raises FileNotFoundError for a missing file and SafetensorsError (message starting with the path) for a malformed
    one."""
    with open(path, "rb") as file:
        try:
            return _read_header_from(file, os.fstat(file.fileno()).st_size)
        except SafetensorsError as e:
            raise _with_path(path, e) from None


def layout(path: os.PathLike | str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The file's tensors as {name: (dtype, shape)}, in data order. Errors as read_header."""
    return {name: (info.dtype, info.shape) for name, info in read_header(path).tensors.items()}


def load_metadata(path: os.PathLike | str) -> dict[str, str]:
    """The file's __metadata__ ({} when it has none). Errors as read_header."""
    return dict(read_header(path).metadata)


def _read_raw(path: os.PathLike | str) -> tuple[Header, dict[str, np.ndarray]]:
    """Each tensor's stored bytes as a NumPy array of its storage dtype (BF16 as uint16), aligned and writable."""
    result: dict[str, np.ndarray] = {}
    with open(path, "rb") as file:
        try:
            header = _read_header_from(file, os.fstat(file.fileno()).st_size)
        except SafetensorsError as e:
            raise _with_path(path, e) from None
        file.seek(header.data_start)
        for name, info in header.tensors.items():
            array = np.empty(info.shape, dtype=DTYPES[info.dtype])
            view = memoryview(array.reshape(-1).view(np.uint8))
            if file.readinto(view) != info.end - info.begin:
                raise SafetensorsError(f"{os.fspath(path)}: tensor {name!r} is cut short (the file shrank while read)")
            result[name] = array
    return header, result


def load(path: os.PathLike | str) -> dict[str, np.ndarray]:
    """Reads every tensor as a NumPy array in native byte order, in data order. BF16 tensors come back as float32
    (every bfloat16 value is exactly a float32). Errors as read_header."""
    header, raw = _read_raw(path)
    tensors = {}
    for name, array in raw.items():
        if header.tensors[name].dtype == "BF16":
            tensors[name] = bf16_bits_to_float32(array)
        else:
            tensors[name] = array.astype(array.dtype.newbyteorder("="), copy=False)
    return tensors


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32: the 16 bits become the float32's upper half. Exact."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float values -> bfloat16 bit patterns (uint16), rounding to nearest, ties to even, as torch does.

    Infinities stay infinite and values that round past the largest bfloat16 become infinities, bit for bit as torch
    converts. A NaN stays a NaN with its sign, made quiet (torch's own NaN bits differ between its scalar and vector
    code paths, 0x7FC0 or 0xFFFF, so no choice matches it everywhere)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    lsb = (bits >> 16) & np.uint32(1)
    rounded = ((bits + np.uint32(0x7FFF) + lsb) >> 16).astype(np.uint16)  # NaNs may wrap here; replaced below
    nan = np.isnan(bits.view(np.float32))
    rounded[nan] = ((bits[nan] >> 16) | np.uint32(0x0040)).astype(np.uint16)
    return rounded


def _encode(name: str, array: np.ndarray, dtype: str | None) -> tuple[str, bytes]:
    """A NumPy array's safetensors dtype and little-endian bytes."""
    if dtype is None:
        if array.dtype.kind == "V" or array.dtype.newbyteorder("=") not in _DTYPE_OF_NUMPY:
            raise SafetensorsError(
                f"tensor {name!r}: NumPy dtype {array.dtype} has no safetensors dtype "
                f"(use float64/32/16, int64/32/16/8, uint8 or bool; bfloat16 via dtypes={{{name!r}: 'BF16'}})")
        dtype = _DTYPE_OF_NUMPY[array.dtype.newbyteorder("=")]
    if dtype not in DTYPES:
        raise SafetensorsError(f"tensor {name!r}: unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    if dtype == "BF16":
        if array.dtype.kind != "f":
            raise SafetensorsError(f"tensor {name!r}: BF16 is written from float arrays, got {array.dtype}")
        stored = float32_to_bf16_bits(array.astype(np.float32, copy=False))
    else:
        stored = array.astype(DTYPES[dtype], copy=False)
    return dtype, np.ascontiguousarray(stored).tobytes()


def _build_header(entries: list[tuple[str, str, tuple[int, ...], int]], metadata: Mapping[str, str] | None) -> bytes:
    header: dict[str, Any] = {}
    if metadata:
        for key, value in metadata.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise SafetensorsError(f"metadata must map strings to strings, got {key!r}: {value!r}")
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, dtype, shape, size in entries:
        if not isinstance(name, str) or not name:
            raise SafetensorsError(f"tensor names must be non-empty strings, got {name!r}")
        if name == "__metadata__":
            raise SafetensorsError("a tensor cannot be named '__metadata__'")
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return text + b" " * (-len(text) % 8)


def atomic_write(path: os.PathLike | str, chunks: Iterable[bytes]) -> None:
    """Writes `chunks` to `path` through a temporary file in the same folder (fsync, then rename), so `path` holds
    either its old content or the whole new one. The temporary file is removed when writing fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        raise


def _write(path: os.PathLike | str, encoded: list[tuple[str, str, tuple[int, ...], bytes]],
           metadata: Mapping[str, str] | None) -> None:
    header = _build_header([(n, d, s, len(b)) for n, d, s, b in encoded], metadata)
    atomic_write(path, [len(header).to_bytes(_LENGTH_BYTES, "little"), header, *(b for _, _, _, b in encoded)])


def save(path: os.PathLike | str, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None,
         dtypes: Mapping[str, str] | None = None) -> None:
    """Writes NumPy arrays (in the mapping's order) atomically.

    Each array's safetensors dtype follows its NumPy dtype (float32 -> F32, int64 -> I64, ...), unless `dtypes` names
    one for it: {"w": "BF16"} writes a float array as bfloat16 (nearest even), {"w": "F16"} converts to float16.
    Raises SafetensorsError for an array NumPy cannot map, an unknown dtype or non-string metadata."""
    dtypes = dict(dtypes or {})
    unknown = sorted(set(dtypes) - set(tensors))
    if unknown:
        raise SafetensorsError(f"dtypes names {unknown[0]!r}, which is not among the tensors")
    encoded = []
    for name, value in tensors.items():
        array = np.asarray(value)
        dtype, data = _encode(name, array, dtypes.get(name))
        encoded.append((name, dtype, array.shape, data))
    _write(path, encoded, metadata)


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("parsyn.safetensors.load_torch/save_torch need PyTorch (Debian: apt install python3-torch)") \
            from e
    return torch


def _torch_dtypes(torch) -> dict[str, Any]:
    return {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
            "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
            "BOOL": torch.bool}


def torch_dtype_name(dtype) -> str:
    """The safetensors name of a torch dtype ("F32" for torch.float32). ValueError for one the format lacks."""
    torch = _torch()
    for name, candidate in _torch_dtypes(torch).items():
        if candidate == dtype:
            return name
    raise SafetensorsError(f"torch dtype {dtype} has no safetensors dtype Parsyn reads")


def load_torch(path: os.PathLike | str, device: str = "cpu") -> dict:
    """Reads every tensor as a torch tensor of the stored dtype (BF16 as torch.bfloat16), on `device`.
    Errors as read_header."""
    torch = _torch()
    header, raw = _read_raw(path)
    dtypes = _torch_dtypes(torch)
    tensors = {}
    for name, array in raw.items():
        dtype = header.tensors[name].dtype
        if dtype == "BF16":
            tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(array.astype(array.dtype.newbyteorder("="), copy=False))
        assert tensor.dtype == dtypes[dtype]
        tensors[name] = tensor.to(device) if device != "cpu" else tensor
    return tensors


def save_torch(path: os.PathLike | str, tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> None:
    """Writes torch tensors (in the mapping's order) atomically, each in its own dtype (torch.bfloat16 as BF16).
    Raises SafetensorsError for a dtype the format lacks (complex, uint16 ...)."""
    torch = _torch()
    encoded = []
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise SafetensorsError(f"tensor {name!r} is a {type(tensor).__name__}, not a torch.Tensor")
        dtype = torch_dtype_name(tensor.dtype)
        cpu = tensor.detach().to("cpu").contiguous()
        if dtype == "BF16":
            cpu = cpu.view(torch.int16)  # the bit patterns; NumPy has no bfloat16
        stored = cpu.numpy().astype(cpu.numpy().dtype.newbyteorder("<"), copy=False)
        encoded.append((name, dtype, tuple(tensor.shape), stored.tobytes()))
    _write(path, encoded, metadata)
