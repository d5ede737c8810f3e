"""The prefix cache's disk tier: prefixes saved for later server processes.

Entries are written a step at a time (`EntryWriter`), so a request that arrives during a save
waits for one step, not for the whole file.

One entry is two files in `<cache dir>/<model identity>/`: `<key>.safetensors` (the per-layer
cache, in mlx-lm's prompt-cache format) and `<key>.json` (format, model identity, the token
sequence, the data file's size and SHA-256). The JSON is written last, so an entry without one
was never finished. Both files are written under temporary names and renamed into place.

An entry is loaded only when its checksum, size, model identity and token count all agree;
anything else — a truncated or corrupt file, another model's entry, an unknown format — is
removed and treated as a miss, never loaded. The directory's total size is kept under a budget
by removing the least recently used entries (a use touches the JSON file's mtime, so the order
survives restarts and is shared by processes using the same directory).

The data file is exactly what mlx-lm's `save_prompt_cache` writes (`load_prompt_cache` reads
it back; a test compares the two), laid out here because `mx.save_safetensors` writes a whole
file in one call: for a real model's 12k-token prefix, about a gigabyte in one go.

Loading and saving run on the engine's MLX thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models.cache import load_prompt_cache

from mlxlaunch.engine.cache.misses import common_prefix

FORMAT = 1
DATA_SUFFIX = ".safetensors"
META_SUFFIX = ".json"
TMP_PREFIX = ".tmp-"
# Saved prompts are the user's data: files and the directories made for them are private.
PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700
# Temporary files older than this are leftovers of a crashed writer.
STALE_TMP_S = 3600.0
# Bytes one save step copies out of MLX, writes and hashes, which is the longest a request
# that arrives during a save waits for it: measured on a 2-core x86 box, 8 MiB took ~17 ms
# (SHA-256 most of it), a 12k-token prefix of 8 layers (393 MB) 0.85 s in all, against
# 1.3 s in one piece for mx.save_safetensors and then hashing the file.
SAVE_STEP_BYTES = 8 << 20
# safetensors' names of the dtypes a cache holds.
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

log = logging.getLogger(__name__)


def model_identity(model_path: str | Path, cache_classes: Sequence[str]) -> str:
    """A digest naming the model's weights and cache layout: equal digests mean equal KV.

    Content-based (config text, weight file names and sizes, cache classes, mlx-lm version),
    so the same model found at another path still matches and a re-quantized one does not.
    """
    digest = hashlib.sha256(f"format={FORMAT};mlx_lm={mlx_lm.__version__}".encode())
    root = Path(model_path)
    config = root / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    for weights in sorted(root.glob("*.safetensors")):
        digest.update(f"{weights.name}:{weights.stat().st_size};".encode())
    digest.update(",".join(cache_classes).encode())
    return digest.hexdigest()[:24]


def tokens_key(tokens: Sequence[int]) -> str:
    """File name stem for a token sequence."""
    return hashlib.sha256(np.asarray(tokens, dtype=np.int64).tobytes()).hexdigest()[:32]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _private_dir(path: Path) -> None:
    """Create `path` (and missing parents) readable by this user only: prompts are private."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    for created in missing:
        with contextlib.suppress(OSError):
            created.chmod(PRIVATE_DIR)


@dataclass
class DiskEntry:
    """One saved prefix, as the index knows it."""

    key: str
    tokens: np.ndarray
    nbytes: int
    sha256: str
    used_at: float

    def __len__(self) -> int:
        return len(self.tokens)


class DiskCache:
    """Saved prefixes of one model under `root`, with LRU removal beyond `budget_bytes`."""

    def __init__(self, root: Path, identity: str, budget_bytes: int) -> None:
        self.root = Path(root)
        self.identity = identity
        self.budget_bytes = budget_bytes
        self.dir = self.root / identity
        self.saves = 0
        self.loads = 0
        self.rejected = 0
        self._entries: dict[str, DiskEntry] = {}
        self.scan()

    # --- index --------------------------------------------------------------------------

    def scan(self) -> None:
        """(Re)read the index from the directory, removing unfinished and foreign entries."""
        self._entries.clear()
        if not self.dir.is_dir():
            return
        now = time.time()
        for path in self.dir.iterdir():
            if path.name.startswith(TMP_PREFIX):
                with contextlib.suppress(OSError):
                    if now - path.stat().st_mtime > STALE_TMP_S:
                        path.unlink()
                continue
            if path.suffix == META_SUFFIX:
                entry = self._read_meta(path)
                if entry is not None:
                    self._entries[entry.key] = entry
        for path in self.dir.glob(f"*{DATA_SUFFIX}"):  # data that no JSON vouches for
            if path.stem not in self._entries and now - path.stat().st_mtime > STALE_TMP_S:
                path.unlink(missing_ok=True)

    def _read_meta(self, path: Path) -> DiskEntry | None:
        key = path.stem
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(meta, dict):  # `[]`, `null`, a number: not an entry of ours
                raise ValueError("metadata is not an object")
            data = self.dir / f"{key}{DATA_SUFFIX}"
            valid = (
                meta.get("format") == FORMAT
                and meta.get("model") == self.identity
                and _token_list(meta.get("tokens"))
                and tokens_key(meta["tokens"]) == key
                and data.is_file()
                and data.stat().st_size == meta.get("bytes")
            )
            if valid:
                tokens = np.asarray(meta["tokens"], dtype=np.int64)
                return DiskEntry(
                    key, tokens, int(meta["bytes"]), str(meta["sha256"]), path.stat().st_mtime
                )
        except (OSError, ValueError, TypeError, KeyError, OverflowError):
            pass  # whatever is wrong with it, it is not an entry: never a reason not to start
        self._remove(key)
        return None

    @property
    def entries(self) -> list[DiskEntry]:
        return list(self._entries.values())

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def best(self, tokens: Sequence[int] | np.ndarray) -> tuple[DiskEntry | None, int]:
        """The entry sharing the longest prefix with `tokens`, and that length."""
        request = np.asarray(tokens, dtype=np.int64)
        best, best_len = None, 0
        for entry in self._entries.values():
            common = common_prefix(request, entry.tokens)
            if common > best_len:
                best, best_len = entry, common
        return best, best_len

    def recent(self, count: int) -> list[DiskEntry]:
        """The `count` most recently used entries, newest first."""
        return sorted(self._entries.values(), key=lambda e: e.used_at, reverse=True)[:count]

    # --- data ---------------------------------------------------------------------------

    def save(self, tokens: Sequence[int], caches: list[Any]) -> DiskEntry | None:
        """Write an entry for `caches` (holding exactly `tokens`) in one go; None if it
        could not be. An entry already saved is only marked as used."""
        key = tokens_key(tokens)
        if key in self._entries:
            self.touch(self._entries[key])
            return self._entries[key]
        writer = self.begin(tokens, caches)
        if writer is None:
            return None
        while not writer.step():
            pass
        return writer.entry

    def begin(self, tokens: Sequence[int], caches: list[Any]) -> EntryWriter | None:
        """A writer of an entry for `caches` (holding exactly `tokens`), to be driven by its
        `step()`; None when there is nothing to write: the entry exists (it is marked as
        used) or it would not fit the budget."""
        key = tokens_key(tokens)
        if key in self._entries:
            self.touch(self._entries[key])
            return None
        writer = EntryWriter(self, tokens, caches)
        if writer.nbytes > self.budget_bytes:
            log.info(
                "prefix cache: %d tokens (%d bytes) exceed the disk budget; not saved",
                len(tokens),
                writer.nbytes,
            )
            return None
        return writer

    def commit(self, writer: EntryWriter, data: Path) -> DiskEntry | None:
        """Put a written data file in place and vouch for it with its JSON (written last)."""
        key = writer.key
        placed = self.dir / f"{key}{DATA_SUFFIX}"
        os.replace(data, placed)
        meta = {
            "format": FORMAT,
            "model": self.identity,
            "tokens": writer.tokens,
            "bytes": writer.nbytes,
            "sha256": writer.sha256,
            "saved_at": time.time(),
        }
        try:
            _write_atomically(self.dir / f"{key}{META_SUFFIX}", json.dumps(meta))
        except OSError:
            placed.unlink(missing_ok=True)  # no JSON vouches for it
            raise
        tokens = np.asarray(writer.tokens, dtype=np.int64)
        entry = DiskEntry(key, tokens, writer.nbytes, writer.sha256, time.time())
        self._entries[key] = entry
        self.saves += 1
        self.enforce_budget()
        return entry if key in self._entries else None

    def load(self, entry: DiskEntry) -> list[Any] | None:
        """The entry's caches, verified; a bad entry is removed and None returned."""
        data = self.dir / f"{entry.key}{DATA_SUFFIX}"
        try:
            if data.stat().st_size != entry.nbytes or _sha256(data) != entry.sha256:
                raise ValueError("checksum mismatch")
            caches, meta = load_prompt_cache(str(data), return_metadata=True)
            if meta.get("model") != self.identity or meta.get("tokens") != str(len(entry)):
                raise ValueError("written for another model or prefix")
            # Loaded arrays are lazy: read them now (during warm start) rather than on the
            # first request that uses them.
            mx.eval([c.state for c in caches])
        except Exception as exc:  # whatever is wrong with the file, it must not be used
            log.warning("prefix cache: ignoring %s (%s)", data.name, exc)
            self.rejected += 1
            self._remove(entry.key)
            return None
        self.loads += 1
        self.touch(entry)
        return list(caches)

    def touch(self, entry: DiskEntry) -> None:
        """Mark an entry as just used (its JSON's mtime orders eviction across processes)."""
        entry.used_at = time.time()
        with contextlib.suppress(OSError):
            os.utime(self.dir / f"{entry.key}{META_SUFFIX}")

    def enforce_budget(self) -> None:
        """Remove least recently used entries, of any model under `root`, beyond the budget."""
        found: list[tuple[float, int, Path]] = []
        for meta in self.root.glob(f"*/*{META_SUFFIX}"):
            if meta.name.startswith(TMP_PREFIX):
                continue
            data = meta.with_suffix(DATA_SUFFIX)
            with contextlib.suppress(OSError):
                found.append((meta.stat().st_mtime, data.stat().st_size, meta))
        total = sum(size for _, size, _ in found)
        for _, size, meta in sorted(found):
            if total <= self.budget_bytes:
                break
            if meta.parent == self.dir:
                self._remove(meta.stem)
            else:
                meta.unlink(missing_ok=True)
                meta.with_suffix(DATA_SUFFIX).unlink(missing_ok=True)
            total -= size

    def _remove(self, key: str) -> None:
        self._entries.pop(key, None)
        # The JSON first: without it the entry no longer exists for any reader.
        for suffix in (META_SUFFIX, DATA_SUFFIX):
            with contextlib.suppress(OSError):
                (self.dir / f"{key}{suffix}").unlink()


class EntryWriter:
    """One entry being written, a bounded number of bytes per `step()` (SAVE_STEP_BYTES).

    Each step copies its bytes out of MLX (so it runs on the MLX thread), writes and hashes
    them; the last one renames the file into place and writes the JSON. Arrays are
    materialized one at a time, as the steps reach them.
    """

    def __init__(self, disk: DiskCache, tokens: Sequence[int], caches: list[Any]) -> None:
        self.disk = disk
        self.tokens = [int(t) for t in tokens]
        self.key = tokens_key(self.tokens)
        about = {"model": disk.identity, "tokens": str(len(self.tokens))}
        arrays, metadata = prompt_cache_contents(caches, about)
        self._header = safetensors_header(arrays, metadata)
        self._arrays = list(arrays.values())
        self.nbytes = len(self._header) + sum(a.nbytes for a in self._arrays)
        self.sha256 = ""
        self.entry: DiskEntry | None = None
        self._digest = hashlib.sha256()
        self._tmp = disk.dir / f"{TMP_PREFIX}{self.key}-{os.getpid()}{DATA_SUFFIX}"
        self._file: Any = None
        self._current: np.ndarray | None = None  # the array being written, as bytes
        self._offset = 0  # into `_current`
        self._done = False

    def step(self, limit: int | None = None) -> bool:
        """Write `limit` more bytes (default SAVE_STEP_BYTES); True once the entry is saved
        or given up."""
        if self._done:
            return True
        try:
            self._write(SAVE_STEP_BYTES if limit is None else limit)
            if self._arrays or self._current is not None:
                return False
            self._file.close()
            self.sha256 = self._digest.hexdigest()
            self.entry = self.disk.commit(self, self._tmp)
        except Exception as exc:  # a full or read-only disk costs reuse, not the request
            log.warning("prefix cache: could not save to %s: %s", self.disk.dir, exc)
            self.abort()
        self._done = True
        return True

    def abort(self) -> None:
        """Give up: close and remove the temporary file."""
        self._done = True
        self._arrays, self._current = [], None
        with contextlib.suppress(OSError, AttributeError):
            self._file.close()
        with contextlib.suppress(OSError):
            self._tmp.unlink(missing_ok=True)

    def _write(self, limit: int) -> None:
        if self._file is None:
            _private_dir(self.disk.dir)
            fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
            self._file = os.fdopen(fd, "wb")
            self._put(self._header)
        written = 0
        while written < limit and (self._current is not None or self._arrays):
            if self._current is None:
                array = self._arrays.pop(0)
                # The whole array as bytes, computed now: one array at a time is held
                # outside the trie (a fetched cache is a lazy concatenation of its blocks).
                self._current = np.asarray(mx.view(mx.contiguous(array).reshape(-1), mx.uint8))
                self._offset = 0
            take = min(limit - written, len(self._current) - self._offset)
            self._put(self._current[self._offset : self._offset + take].data)
            self._offset += take
            written += take
            if self._offset >= len(self._current):
                self._current = None

    def _put(self, data: bytes | memoryview) -> None:
        self._file.write(data)
        self._digest.update(data)


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
    classes = [type(c).__name__ for c in caches]
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


def _token_list(value: object) -> bool:
    """Whether `value` is a list of token ids (ints in int64 range; not floats such as 1e400,
    not booleans)."""
    return isinstance(value, list) and all(type(t) is int and 0 <= t < 2**63 for t in value)
