"""parsyn.safetensors: round trips (NumPy and torch), the strict reader's errors, bf16 conversion against torch."""

import json
import struct
import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch

from parsyn import safetensors


def image(header: dict | bytes, data: bytes = b"", length: int | None = None) -> bytes:
    """A safetensors file from a header (dict or raw bytes) and a data section."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def entry(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


class SafetensorsTest(unittest.TestCase):
    def setUp(self):
        self.folder = Path(self.enterContext(tempfile.TemporaryDirectory(prefix="parsyn-st-")))
        self.path = self.folder / "w.safetensors"

    def test_numpy_round_trip_of_every_dtype_with_metadata_and_empty_tensors(self):
        rng = np.random.default_rng(1)
        tensors = {
            "f32": rng.normal(size=(3, 4)).astype(np.float32),
            "f16": rng.normal(size=(5,)).astype(np.float16),
            "f64": rng.normal(size=(2, 2)).astype(np.float64),
            "i64": np.array([-(2**62), 0, 2**62], np.int64),
            "i32": np.array([1, -2], np.int32),
            "i16": np.array([3], np.int16),
            "i8": np.array([-4], np.int8),
            "u8": np.array([255], np.uint8),
            "bool": np.array([True, False]),
            "empty": np.zeros((0,), np.float32),
            "empty2d": np.zeros((3, 0), np.int64),
            "scalar": np.array(2.5, np.float32),
        }
        safetensors.save(self.path, tensors, metadata={"format": "pt", "round": "3"})
        loaded = safetensors.load(self.path)
        self.assertEqual(list(loaded), list(tensors))
        for name, array in tensors.items():
            self.assertEqual(loaded[name].dtype, array.dtype, name)
            self.assertEqual(loaded[name].shape, array.shape, name)
            np.testing.assert_array_equal(loaded[name], array, name)
        self.assertEqual(safetensors.load_metadata(self.path), {"format": "pt", "round": "3"})
        self.assertEqual(safetensors.layout(self.path)["f32"], ("F32", (3, 4)))
        self.assertEqual(safetensors.layout(self.path)["empty2d"], ("I64", (3, 0)))

    def test_the_writer_pads_the_header_and_lays_tensors_out_in_order(self):
        safetensors.save(self.path, {"b": np.ones(3, np.float32), "a": np.ones(1, np.float16)})
        raw = self.path.read_bytes()
        length = struct.unpack("<Q", raw[:8])[0]
        self.assertEqual(length % 8, 0)
        header = json.loads(raw[8:8 + length])
        self.assertEqual(list(header), ["b", "a"])
        self.assertEqual(header["b"]["data_offsets"], [0, 12])
        self.assertEqual(header["a"]["data_offsets"], [12, 14])
        self.assertEqual(len(raw), 8 + length + 14)
        self.assertEqual(raw[8 + length:8 + length + 4], struct.pack("<f", 1.0))

    def test_bf16_is_written_from_float_arrays_and_read_back_as_float32(self):
        values = np.array([1.0, 1.00390625, -2.5, 3.0e38, 1e-40], np.float32)
        safetensors.save(self.path, {"w": values}, dtypes={"w": "BF16"})
        self.assertEqual(safetensors.layout(self.path), {"w": ("BF16", (5,))})
        expected = torch.from_numpy(values).to(torch.bfloat16).float().numpy()
        np.testing.assert_array_equal(safetensors.load(self.path)["w"], expected)
        # Loaded BF16 values are exact: writing them again gives the same bits.
        again = self.folder / "again.safetensors"
        safetensors.save(again, safetensors.load(self.path), dtypes={"w": "BF16"})
        self.assertEqual(again.read_bytes(), self.path.read_bytes())

    def test_bf16_conversion_is_bit_exact_against_torch(self):
        rng = np.random.default_rng(7)
        ordinary = np.concatenate([
            rng.normal(0, 1, 20000), rng.normal(0, 1e30, 2000), rng.normal(0, 1e-38, 2000),
            [0.0, -0.0, np.inf, -np.inf, 3.3895314e38, 3.4028235e38, -3.4028235e38, 1.0 + 2**-8, 1.0 + 3 * 2**-8],
        ]).astype(np.float32)
        any_bits = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)  # NaNs too
        values = np.concatenate([ordinary, any_bits])
        ours = safetensors.float32_to_bf16_bits(values)
        theirs = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        finite_or_inf = ~np.isnan(values)
        np.testing.assert_array_equal(ours[finite_or_inf], theirs[finite_or_inf])
        self.assertTrue(np.isnan(safetensors.bf16_bits_to_float32(ours[~finite_or_inf])).all())
        widened = torch.from_numpy(theirs.view(np.int16)).view(torch.bfloat16).float().numpy()
        np.testing.assert_array_equal(safetensors.bf16_bits_to_float32(theirs)[finite_or_inf], widened[finite_or_inf])

    def test_torch_round_trip_keeps_bf16_as_bf16(self):
        tensors = {"bf16": torch.randn(4, 3).to(torch.bfloat16), "f32": torch.randn(2),
                   "f16": torch.randn(3).half(), "i64": torch.tensor([1, -2, 3]), "empty": torch.zeros(0, 5),
                   "t": torch.randn(3, 2).t()}  # not contiguous
        safetensors.save_torch(self.path, tensors, metadata={"k": "v"})
        loaded = safetensors.load_torch(self.path)
        self.assertEqual(list(loaded), list(tensors))
        for name, tensor in tensors.items():
            self.assertEqual(loaded[name].dtype, tensor.dtype, name)
            self.assertTrue(torch.equal(loaded[name], tensor), name)
        self.assertEqual(safetensors.layout(self.path)["bf16"], ("BF16", (4, 3)))
        np.testing.assert_array_equal(safetensors.load(self.path)["bf16"], tensors["bf16"].float().numpy())

    def test_numpy_bf16_written_file_reads_in_torch_as_torch_would_round(self):
        values = np.random.default_rng(3).normal(size=(64,)).astype(np.float32)
        safetensors.save(self.path, {"w": values}, dtypes={"w": "BF16"})
        self.assertTrue(torch.equal(safetensors.load_torch(self.path)["w"], torch.from_numpy(values).bfloat16()))

    def test_write_is_atomic_and_a_failed_write_keeps_the_old_file(self):
        safetensors.save(self.path, {"w": np.ones(2, np.float32)})
        before = self.path.read_bytes()
        with self.assertRaisesRegex(safetensors.SafetensorsError, "complex128 has no safetensors dtype"):
            safetensors.save(self.path, {"w": np.ones(2, np.complex128)})
        with self.assertRaisesRegex(safetensors.SafetensorsError, "metadata must map strings to strings"):
            safetensors.save(self.path, {"w": np.ones(2, np.float32)}, metadata={"n": 3})
        self.assertEqual(self.path.read_bytes(), before)
        self.assertEqual(sorted(p.name for p in self.folder.iterdir()), ["w.safetensors"])

    def test_malformed_files_are_refused_naming_the_rule(self):
        f32 = struct.pack("<2f", 1, 2)
        cases = [
            ("short", b"\x01\x02", "too short for the 8-byte header length"),
            ("header past end", image(b"{}", length=100), "header length 100 runs past the end of the file"),
            ("header cap", struct.pack("<Q", 1 << 40), "exceeds the cap"),
            ("not utf-8", image(b'{"\xff": 1}'), "not valid UTF-8"),
            ("not json", image(b"{nope"), "not valid JSON"),
            ("not object", image(b"[]"), "not a JSON object"),
            ("duplicate", image(b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": '
                                b'{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', f32[:4]),
             "duplicate key 'a'"),
            ("dtype", image({"a": entry("Q8", [2], 0, 8)}, f32), "unknown dtype 'Q8'"),
            ("field", image({"a": {**entry("F32", [2], 0, 8), "extra": 1}}, f32), "unknown field 'extra'"),
            ("missing", image({"a": {"dtype": "F32", "shape": [2]}}, f32), "missing field 'data_offsets'"),
            ("negative dim", image({"a": entry("F32", [-2], 0, 8)}, f32), "shape must be an array"),
            ("bool dim", image({"a": entry("F32", [True], 0, 4)}, f32[:4]), "shape must be an array"),
            ("size", image({"a": entry("F32", [3], 0, 8)}, f32), "needs 12 bytes but data_offsets [0, 8] span 8"),
            ("reversed", image({"a": entry("F32", [0], 8, 4)}, f32), "end before they begin"),
            ("offsets", image({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, f32),
             "data_offsets must be an array of two"),
            ("gap", image({"a": entry("F32", [1], 0, 4), "b": entry("F32", [1], 8, 12)}, f32 + f32[:4]),
             "leave a gap of 4 bytes after tensor 'a'"),
            ("first not at 0", image({"a": entry("F32", [1], 4, 8)}, f32), "first tensor must start at offset 0"),
            ("overlap", image({"a": entry("F32", [2], 0, 8), "b": entry("F32", [1], 4, 8)}, f32),
             "overlap tensor 'a'"),
            ("trailing", image({"a": entry("F32", [1], 0, 4)}, f32), "4 trailing bytes after the last tensor 'a'"),
            ("past end", image({"a": entry("F32", [4], 0, 16)}, f32), "run past the end of the data section"),
            ("metadata value", image({"__metadata__": {"k": 1}}), "__metadata__ value for 'k' is not a string"),
            ("metadata", image({"__metadata__": [1]}), "__metadata__ is not an object"),
            ("empty name", image({"": entry("F32", [0], 0, 0)}), "tensor name is empty"),
        ]
        for name, data, message in cases:
            with self.subTest(name):
                self.path.write_bytes(data)
                with self.assertRaises(safetensors.SafetensorsError) as caught:
                    safetensors.load(self.path)
                self.assertIn(message, str(caught.exception))
                self.assertTrue(str(caught.exception).startswith(str(self.path)))

    def test_a_header_without_tensors_and_empty_tensors_sharing_an_offset_are_valid(self):
        self.path.write_bytes(image({"__metadata__": {"a": "b"}}))
        self.assertEqual(safetensors.load(self.path), {})
        self.path.write_bytes(image({"x": entry("F32", [0], 0, 0), "y": entry("F32", [1], 0, 4),
                                     "z": entry("I8", [0], 4, 4)}, struct.pack("<f", 3)))
        loaded = safetensors.load(self.path)
        self.assertEqual(loaded["y"].tolist(), [3.0])
        self.assertEqual(loaded["z"].shape, (0,))

    def test_missing_file_raises_file_not_found(self):
        with self.assertRaises(FileNotFoundError):
            safetensors.load(self.folder / "absent.safetensors")


if __name__ == "__main__":
    unittest.main()
