"""The data file of a disk cache entry: mlx-lm's prompt-cache layout in a safetensors file.

Written here a step at a time (see disk.EntryWriter) and read back only after its header was
validated as data: a bounded JSON object whose tensors have known dtypes, whole shapes and
offsets that tile the file exactly. The cache objects are then rebuilt from the arrays with
the classes the model's own layout names (entry_check.KVLayout), never a class a file names.

mlx-lm's `load_prompt_cache` would take a path (so it follows symlinks) and build whatever
class of its cache module the file names; `prompt_cache_from` is its recipe, narrowed.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import cache as mlx_lm_cache

# safetensors' names of the dtypes a cache holds, and their sizes in bytes.
SAFETENSORS_DTYPES = {
    mx.bool_: "BOOL",
    mx.uint8: "U8",
    mx.uint16: "U16",
    mx.uint32: "U32",
    mx.uint64: "U64",
    mx.int8: "I8",
    mx.int16: "I16",
    mx.int32: "I32",
    mx.int64: "I64",
    mx.float16: "F16",
    mx.bfloat16: "BF16",
    mx.float32: "F32",
    mx.float64: "F64",
}
DTYPE_SIZES = {name: dtype.size for dtype, name in SAFETENSORS_DTYPES.items()}
# A header longer than this is not one we wrote: a 100-layer model's header is ~20 KB.
MAX_HEADER_BYTES = 16 << 20


class EntryFormatError(ValueError):
    """A data file that is not an entry's: its header, arrays or classes are wrong."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as a safetensors header describes it."""

    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


@dataclass(frozen=True)
class EntryHeader:
    """A validated safetensors header: tensors in file order, string metadata."""

    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]

    def classes(self) -> list[str]:
        """The cache classes the metadata names, layer by layer (mlx-lm's `1.<i>` keys)."""
        return _numbered(self.metadata, "1")

    def scalars(self) -> list[str]:
        """The metadata's scalar list, flattened as written (mlx-lm's `2.<i>...` keys)."""
        return [f"{k}={v}" for k, v in sorted(self.metadata.items()) if k.startswith("2.")]


def prompt_cache_contents(
    caches: Sequence[Any], metadata: dict[str, str]
) -> tuple[dict[str, mx.array], dict[str, str]]:
    """The arrays and metadata mlx-lm's `save_prompt_cache` writes for `caches`.

    Its own recipe: each cache's `state` flattened, with scalars, strings and None stored as
    small arrays and named in a list the loader converts back.
    """
    scalars: list[Any] = [""]  # kept non-empty, as mlx-lm does: tree_flatten drops empty lists
    arrays: dict[str, mx.array] = {}
    leaves: Any = tree_flatten([c.state for c in caches])
    for name, value in leaves:
        if isinstance(value, mx.array):
            arrays[name] = value
        elif isinstance(value, (int, float, bool)):
            scalars.append((name, "scalar"))
            arrays[name] = mx.array(value)
        elif isinstance(value, str):
            scalars.append((name, "string"))
            arrays[name] = mx.array([ord(char) for char in value])
        elif value is None:
            scalars.append((name, "none"))
            arrays[name] = mx.array([])
        else:
            raise ValueError(f"cache state is not serializable: {type(value).__name__}")
    # A class of this project's that keeps mlx-lm's layout is saved under mlx-lm's name.
    classes = [getattr(type(c), "SAVED_AS", type(c).__name__) for c in caches]
    flat: Any = tree_flatten([metadata, classes, scalars])
    return arrays, dict(flat)


def safetensors_header(arrays: dict[str, mx.array], metadata: dict[str, str]) -> bytes:
    """The length-prefixed JSON header of a safetensors file holding `arrays` in order."""
    described: dict[str, Any] = {}
    offset = 0
    for name, array in arrays.items():
        dtype = SAFETENSORS_DTYPES.get(array.dtype)
        if dtype is None:
            raise ValueError(f"no safetensors dtype for {array.dtype}")
        described[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    described["__metadata__"] = metadata
    text = json.dumps(described, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the format advises
    return struct.pack("<Q", len(text)) + text


def read_header(file: BinaryIO, file_size: int) -> EntryHeader:
    """The header of the safetensors file `file` (at its start), validated against its size.

    Raises EntryFormatError for anything but a bounded JSON object of tensors with known
    dtypes, non-negative integer shapes and offsets that cover the data exactly.
    """
    prefix = file.read(8)
    if len(prefix) != 8:
        raise EntryFormatError("shorter than a header")
    (length,) = struct.unpack("<Q", prefix)
    if length > MAX_HEADER_BYTES or 8 + length > file_size:
        raise EntryFormatError("header length out of range")
    try:
        described = json.loads(file.read(length).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise EntryFormatError(f"header is not JSON: {exc}") from None
    if not isinstance(described, dict):
        raise EntryFormatError("header is not an object")
    metadata = described.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise EntryFormatError("metadata is not a map of strings")
    tensors = {name: _tensor(name, info) for name, info in described.items()}
    end = 0
    for info in sorted(tensors.values(), key=lambda t: t.start):
        if info.start != end:
            raise EntryFormatError("tensor data has gaps or overlaps")
        end = info.end
    if 8 + length + end != file_size:
        raise EntryFormatError("tensor data does not fill the file")
    return EntryHeader(tensors, metadata)


def prompt_cache_from(arrays: dict[str, mx.array], header: EntryHeader) -> list[Any]:
    """The caches a loaded entry holds (mlx-lm's `load_prompt_cache`, after `read_header`).

    Only cache classes of mlx-lm's cache module are built; the caller has compared the
    header's classes with the model's before loading the arrays.
    """
    values: dict[str, Any] = dict(arrays)
    for name, kind in _scalar_kinds(header.metadata):
        array = values.get(name)
        if array is None:
            raise EntryFormatError(f"scalar {name!r} has no array")
        if kind == "scalar":
            values[name] = array.item()
        elif kind == "string":
            values[name] = "".join(chr(int(i)) for i in array.tolist())
        elif kind == "none":
            values[name] = None
        else:
            raise EntryFormatError(f"unknown scalar kind {kind!r}")
    states: Any = tree_unflatten(list(values.items()))
    classes = header.classes()
    if not isinstance(states, list) or len(states) != len(classes):
        raise EntryFormatError("states and classes disagree")
    caches = []
    for name, state in zip(classes, states, strict=True):
        cls = getattr(mlx_lm_cache, name, None)
        build = getattr(cls, "from_state", None)
        if not (isinstance(cls, type) and cls.__module__ == mlx_lm_cache.__name__ and build):
            raise EntryFormatError(f"not a cache class: {name!r}")
        caches.append(build(state))
    return caches


def _tensor(name: str, info: object) -> TensorInfo:
    if not isinstance(info, dict):
        raise EntryFormatError(f"tensor {name!r} is not described")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPE_SIZES:
        raise EntryFormatError(f"tensor {name!r}: unknown dtype")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise EntryFormatError(f"tensor {name!r}: bad shape")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(o) is int and o >= 0 for o in offsets)
    ):
        raise EntryFormatError(f"tensor {name!r}: bad offsets")
    start, end = offsets
    if end - start != math.prod(shape) * DTYPE_SIZES[dtype]:
        raise EntryFormatError(f"tensor {name!r}: offsets disagree with its shape")
    return TensorInfo(dtype, tuple(shape), start, end)


def _numbered(metadata: dict[str, str], prefix: str) -> list[str]:
    """Values of keys `<prefix>.0`, `<prefix>.1`, … in order (tree_flatten's list layout)."""
    found: list[str] = []
    while f"{prefix}.{len(found)}" in metadata:
        found.append(metadata[f"{prefix}.{len(found)}"])
    return found


def _scalar_kinds(metadata: dict[str, str]) -> list[tuple[str, str]]:
    """The (array name, kind) pairs of mlx-lm's scalar list (`2.<i>.0`, `2.<i>.1`; entry 0
    is the placeholder that keeps the list non-empty)."""
    pairs = []
    index = 1
    while f"2.{index}.0" in metadata:
        pairs.append((metadata[f"2.{index}.0"], metadata.get(f"2.{index}.1", "")))
        index += 1
    return pairs
