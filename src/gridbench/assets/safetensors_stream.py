"""Safetensors files of any size, written and read one tensor at a time.

``safetensors.numpy.save`` holds every tensor in memory and numpy has no bfloat16, so a
multi-billion-parameter BF16 checkpoint is written here from the format itself: an 8-byte
little-endian header length, a JSON header of each tensor's dtype, shape and byte range,
then the tensors' bytes back to back. Tensors are made on threads and written in order
with a bounded look-ahead, so memory stays at a few tensors whatever the model's size.
"""

from __future__ import annotations

import json
import os
import struct
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gridbench.util.files import JsonObject

# Makes a tensor's float32 values; called on a worker thread, once.
Values = Callable[[], np.ndarray]


@dataclass(frozen=True, slots=True)
class StreamedTensor:
    name: str
    shape: tuple[int, ...]
    values: Values
    dtype: str = "BF16"  # as stored: BF16, F16 or F32


_ITEM_BYTES = {"BF16": 2, "F16": 2, "F32": 4}


def to_bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest even, as torch does."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def from_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32, exactly."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _encode(tensor: StreamedTensor) -> bytes:
    values = tensor.values()
    if values.shape != tensor.shape:
        raise ValueError(f"{tensor.name}: made shape {values.shape}, declared {tensor.shape}")
    if tensor.dtype == "BF16":
        return to_bfloat16(values).tobytes()
    return values.astype(np.float16 if tensor.dtype == "F16" else np.float32).tobytes()


def write_safetensors(
    path: Path,
    tensors: Sequence[StreamedTensor],
    metadata: dict[str, str] | None = None,
    threads: int | None = None,
) -> Path:
    """Write ``tensors`` in order; the file appears under its name only once complete."""
    header: JsonObject = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for tensor in tensors:
        size = int(np.prod(tensor.shape)) * _ITEM_BYTES[tensor.dtype]
        header[tensor.name] = {
            "dtype": tensor.dtype,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the tensors start 8-byte aligned
    threads = threads or min(16, os.cpu_count() or 1)

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    try:
        with partial.open("wb") as f, ThreadPoolExecutor(threads) as pool:
            f.write(struct.pack("<Q", len(encoded)) + encoded)
            pending: deque[Future[bytes]] = deque()
            for tensor in tensors:
                pending.append(pool.submit(_encode, tensor))
                if len(pending) > 2 * threads:  # bounded look-ahead: memory stays flat
                    f.write(pending.popleft().result())
            while pending:
                f.write(pending.popleft().result())
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path


@dataclass(frozen=True, slots=True)
class StoredTensor:
    """One tensor of a safetensors file, memory-mapped: nothing is read until asked."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    raw: np.ndarray

    def float32(self) -> np.ndarray:
        if self.dtype == "BF16":
            return from_bfloat16(self.raw)
        return self.raw.astype(np.float32)


_NUMPY_DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}


def read_safetensors(path: Path) -> Iterator[StoredTensor]:
    """The file's tensors in file order, memory-mapped."""
    with Path(path).open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + length)
    for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
        dtype, shape = entry["dtype"], tuple(entry["shape"])
        if dtype not in _NUMPY_DTYPES:
            raise ValueError(f"{path}: tensor {name} is {dtype}; only {sorted(_NUMPY_DTYPES)} are read")
        start, end = entry["data_offsets"]
        yield StoredTensor(name, dtype, shape, data[start:end].view(_NUMPY_DTYPES[dtype]).reshape(shape))
