"""The prefix cache's disk tier: prefixes saved for later server processes.

Entries are written a step at a time (`EntryWriter`), so a request that arrives during a save
waits for one step, not for the whole file. An entry is used only after its files were
checked as data against the model; the directory is never trusted beyond the files written.

One entry is two files in `<cache dir>/<model identity>/` (see weight_identity.py):
`<key>.safetensors` (the per-layer cache, in mlx-lm's prompt-cache format, entry_format.py)
and `<key>.json` (format, writer, model identity, the token sequence, the data file's size and
SHA-256). The JSON is written last, so an entry without one was never finished. Both files
are written under temporary names and renamed into place.

What this server wrote is told apart from anything else that lies there: a JSON carrying the
writer marker and this format, named `<32 hex digits>.json`, in this identity's directory, is
ours; so are the data file it names and temporary files named as the writer names them.
Nothing else is ever removed, counted against the budget or loaded; another model's directory
is never touched. No path is followed through a symlink: the identity directory is opened
once with O_NOFOLLOW (a symlink or file there turns the disk tier off) and every file is
opened, listed, renamed and removed relative to that descriptor, with O_NOFOLLOW.

An entry is loaded only when its size, model identity, token count, layout (entry_check.py:
layers, cache classes, dtypes and shapes of this model's cache) and checksum all agree;
anything else is skipped, logged once, and removed if it is ours. The directory's entries are
kept under a budget by removing the least recently used (a use touches the JSON file's mtime,
so the order survives restarts and is shared by processes using the same directory).

Loading and saving run on the engine's MLX thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxlaunch.engine.cache.entry_check import KVLayout, positions_problem
from mlxlaunch.engine.cache.entry_format import (
    EntryFormatError,
    prompt_cache_contents,
    prompt_cache_from,
    read_header,
    safetensors_header,
)
from mlxlaunch.engine.cache.misses import common_prefix
from mlxlaunch.engine.cache.weight_identity import model_identity as model_identity
from mlxlaunch.engine.runtime.quantized_kv import KVQuantization, adopted, new_caches

FORMAT = 2
# Written into every entry's JSON: what carries it (with FORMAT) was written by this server.
WRITER = "mlxlaunch"
DATA_SUFFIX = ".safetensors"
META_SUFFIX = ".json"
TMP_PREFIX = ".tmp-"
KEY = re.compile(r"[0-9a-f]{32}")
# The writer's temporary names: `.tmp-<key>-<pid>.safetensors` and `.tmp-<key>.json-<pid>`.
TMP_NAME = re.compile(r"\.tmp-[0-9a-f]{32}(?:-\d+\.safetensors|\.json-\d+)")
# Saved prompts are the user's data: files and the directories made for them are private.
PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700
# Temporary files older than this are leftovers of a crashed writer.
STALE_TMP_S = 3600.0
# An entry's JSON larger than this is not ours: a 200k-token prompt's is ~1.5 MB.
MAX_META_BYTES = 32 << 20
# Bytes one save step copies out of MLX, writes and hashes, which is the longest a request
# that arrives during a save waits for it: measured on a 2-core x86 box, 8 MiB took ~17 ms
# (SHA-256 most of it), a 12k-token prefix of 8 layers (393 MB) 0.85 s in all, against
# 1.3 s in one piece for mx.save_safetensors and then hashing the file.
SAVE_STEP_BYTES = 8 << 20
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # no symlink; a FIFO never blocks

log = logging.getLogger(__name__)

__all__ = [
    "DiskCache",
    "DiskEntry",
    "EntryWriter",
    "UnsafeCacheDir",
    "model_identity",
    "open_disk_cache",
    "tokens_key",
]


class UnsafeCacheDir(OSError):
    """The identity directory is a symlink, a file, or cannot be opened: not used."""


class EntryRejected(ValueError):
    """An entry whose files are not this model's KV (carries the reason)."""


def open_disk_cache(
    root: Path,
    budget_bytes: int,
    model: nn.Module,
    model_path: str | Path,
    kv: KVQuantization | None = None,
) -> DiskCache | None:
    """The disk tier for `model` under `root`, or None (logged) where it cannot be used.

    The identity hashes the weights' content (remembered under `root`) and names how the KV is
    held (`kv`: its bits and group size), so a quantized entry never meets a server that holds
    its KV otherwise; entries are checked against the model's cache layout, read from a
    one-token forward pass.
    """
    template = new_caches(model, kv)
    layout = KVLayout.of_model(model, kv)
    if layout is None:
        log.warning("prefix cache: disk tier off (entries could not be checked)")
        return None
    classes = [type(c).__name__ for c in template]
    if kv is not None:
        classes.append(kv.label)
    try:
        identity = model_identity(model_path, classes, memo_dir=Path(root))
        return DiskCache(Path(root), identity, budget_bytes, layout=layout)
    except OSError as exc:
        log.warning("prefix cache: disk tier off (%s)", exc)
        return None


def tokens_key(tokens: Sequence[int]) -> str:
    """File name stem for a token sequence."""
    return hashlib.sha256(np.asarray(tokens, dtype=np.int64).tobytes()).hexdigest()[:32]


def _write_atomically(dir_fd: int, name: str, text: str) -> None:
    tmp = f"{TMP_PREFIX}{name}-{os.getpid()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    fd = os.open(tmp, flags, PRIVATE_FILE, dir_fd=dir_fd)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


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
    """Saved prefixes of one model under `root`, with LRU removal beyond `budget_bytes`.

    `layout`: the model's cache layout, which every entry must match before it is used
    (None checks entries against themselves only, for tests without a model).
    """

    def __init__(
        self, root: Path, identity: str, budget_bytes: int, layout: KVLayout | None = None
    ) -> None:
        if not identity or identity in (".", "..") or "/" in identity or "\0" in identity:
            raise UnsafeCacheDir(f"not a directory name: {identity!r}")
        self.root = Path(root)
        self.identity = identity
        self.budget_bytes = budget_bytes
        self.layout = layout
        self.dir = self.root / identity
        self.saves = 0
        self.loads = 0
        self.rejected = 0
        self._entries: dict[str, DiskEntry] = {}
        self._fd = self._open_dir()
        self.scan()

    def _open_dir(self) -> int:
        try:
            _private_dir(self.root)  # the root is the user's choice: a symlink there is theirs
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.dir, PRIVATE_DIR)
            return os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            log.warning("prefix cache: %s is a symlink or not a directory: not used", self.dir)
            raise UnsafeCacheDir(f"{self.dir} is not a directory of its own ({exc})") from exc

    def close(self) -> None:
        """Let go of the directory (the index stays readable, files are no longer touched)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # --- index --------------------------------------------------------------------------

    def scan(self) -> None:
        """(Re)read the index from the directory, removing our unfinished or broken entries
        and leaving everything else alone."""
        self._entries.clear()
        now = time.time()
        names = self._names()
        for name in names:
            if TMP_NAME.fullmatch(name):
                found = self._regular(name)
                if found is not None and now - found.st_mtime > STALE_TMP_S:
                    self._unlink(name)
            elif name.endswith(META_SUFFIX) and KEY.fullmatch(name[: -len(META_SUFFIX)]):
                entry = self._read_meta(name[: -len(META_SUFFIX)])
                if entry is not None:
                    self._entries[entry.key] = entry
        for name in names:  # data that no JSON vouches for, left by a writer that crashed
            key = name[: -len(DATA_SUFFIX)]
            if name.endswith(DATA_SUFFIX) and KEY.fullmatch(key) and key not in self._entries:
                found = self._regular(name)
                stale = found is not None and now - found.st_mtime > STALE_TMP_S
                if stale and f"{key}{META_SUFFIX}" not in names and self._data_is_ours(name):
                    self._unlink(name)

    def _read_meta(self, key: str) -> DiskEntry | None:
        """The entry `<key>.json` describes, if it is ours and whole; ours and broken: removed;
        not ours (not even readable as ours): None, and left where it is."""
        try:
            meta = json.loads(self._read_small(f"{key}{META_SUFFIX}", MAX_META_BYTES))
        except (OSError, ValueError, RecursionError):
            return None
        if not (isinstance(meta, dict) and meta.get("writer") == WRITER):
            return None
        if meta.get("format") != FORMAT:
            return None  # another version's: neither used nor removed
        try:
            tokens, nbytes, sha256 = meta.get("tokens"), meta.get("bytes"), meta.get("sha256")
            data = self._regular(f"{key}{DATA_SUFFIX}")
            if (
                meta.get("model") == self.identity
                and isinstance(nbytes, int)
                and not isinstance(nbytes, bool)
                and isinstance(sha256, str)
                and data is not None
                and data.st_size == nbytes
                and _token_list(tokens)
                and tokens_key(tokens) == key
            ):
                used = self._regular(f"{key}{META_SUFFIX}")
                at = used.st_mtime if used is not None else time.time()
                ids = np.asarray(tokens, dtype=np.int64)
                return DiskEntry(key, ids, nbytes, sha256, at)
        except (OSError, ValueError, TypeError, OverflowError):
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

    def commit(self, writer: EntryWriter, data: str) -> DiskEntry | None:
        """Put a written data file (`data`, a name in the directory) in place and vouch for
        it with its JSON (written last)."""
        key = writer.key
        placed = f"{key}{DATA_SUFFIX}"
        os.replace(data, placed, src_dir_fd=self._fd, dst_dir_fd=self._fd)
        meta = {
            "format": FORMAT,
            "writer": WRITER,
            "model": self.identity,
            "tokens": writer.tokens,
            "bytes": writer.nbytes,
            "sha256": writer.sha256,
            "saved_at": time.time(),
        }
        try:
            _write_atomically(self._fd, f"{key}{META_SUFFIX}", json.dumps(meta))
        except OSError:
            self._unlink(placed)  # no JSON vouches for it
            raise
        tokens = np.asarray(writer.tokens, dtype=np.int64)
        entry = DiskEntry(key, tokens, writer.nbytes, writer.sha256, time.time())
        self._entries[key] = entry
        self.saves += 1
        self.enforce_budget()
        return entry if key in self._entries else None

    def load(self, entry: DiskEntry) -> list[Any] | None:
        """The entry's caches, verified against the model; a bad entry is skipped for good
        (logged once, removed: it is ours) and None returned. Never raises."""
        name = f"{entry.key}{DATA_SUFFIX}"
        try:
            caches = self._load(name, entry)
        except Exception as exc:  # whatever is wrong with the file, it must not be used
            log.warning("prefix cache: ignoring %s (%s)", name, exc)
            self.rejected += 1
            self._remove(entry.key)
            return None
        self.loads += 1
        self.touch(entry)
        return caches

    def _load(self, name: str, entry: DiskEntry) -> list[Any]:
        with self._open_regular(name) as f:
            size = os.fstat(f.fileno()).st_size
            if size != entry.nbytes:
                raise EntryRejected(f"{size} bytes, not {entry.nbytes}")
            header = read_header(f, size)  # checked before a byte of data is read
            about = (header.metadata.get("0.model"), header.metadata.get("0.tokens"))
            if about != (self.identity, str(len(entry))):
                raise EntryRejected("written for another model or prefix")
            problem = self.layout.header_problem(header) if self.layout else None
            if problem is not None:
                raise EntryRejected(f"not this model's cache: {problem}")
            f.seek(0)
            if _sha256(f) != entry.sha256:
                raise EntryRejected("checksum mismatch")
            f.seek(0)
            arrays = mx.load(f, format="safetensors")
            if not isinstance(arrays, dict) or set(arrays) != set(header.tensors):
                raise EntryFormatError("the arrays differ from the header")
            caches = prompt_cache_from(arrays, header)
            # Loaded arrays are lazy: read them now, while the file is open (and during warm
            # start) rather than on the first request that uses them.
            mx.eval([c.state for c in caches])
        if self.layout is not None:
            problem = self.layout.cache_problem(caches, len(entry))
        else:
            problem = positions_problem(caches, len(entry))
        if problem is not None:
            raise EntryRejected(f"not this model's cache: {problem}")
        return adopted(caches)

    def touch(self, entry: DiskEntry) -> None:
        """Mark an entry as just used (its JSON's mtime orders eviction across processes)."""
        entry.used_at = time.time()
        with contextlib.suppress(OSError, NotImplementedError):
            os.utime(f"{entry.key}{META_SUFFIX}", dir_fd=self._fd, follow_symlinks=False)

    def enforce_budget(self) -> None:
        """Remove this model's least recently used entries beyond the budget.

        Only our entries in this identity's directory count and go, those other processes
        wrote into it since the scan included; other directories are never looked into.
        """
        names = set(self._names())
        for name in names:
            key = name[: -len(META_SUFFIX)]
            if name.endswith(META_SUFFIX) and KEY.fullmatch(key) and key not in self._entries:
                entry = self._read_meta(key)
                if entry is not None:
                    self._entries[key] = entry
        for key in [k for k in self._entries if f"{k}{META_SUFFIX}" not in names]:
            del self._entries[key]  # removed by another process
        found: list[tuple[float, str]] = []
        for key, entry in self._entries.items():
            meta = self._regular(f"{key}{META_SUFFIX}")  # another process's use counts too
            found.append((max(meta.st_mtime if meta else 0.0, entry.used_at), key))
        total = self.nbytes
        for _, key in sorted(found):
            if total <= self.budget_bytes:
                break
            total -= self._entries[key].nbytes
            self._remove(key)

    # --- files, relative to the directory's descriptor ------------------------------------

    def _names(self) -> list[str]:
        try:
            return os.listdir(self._fd)
        except (OSError, ValueError):
            return []

    def _regular(self, name: str) -> os.stat_result | None:
        """`name`'s own status if it is a regular file (never through a symlink), else None."""
        try:
            found = os.stat(name, dir_fd=self._fd, follow_symlinks=False)
        except (OSError, ValueError):
            return None
        return found if stat.S_ISREG(found.st_mode) else None

    def _open_regular(self, name: str) -> Any:
        fd = os.open(name, READ_FLAGS, dir_fd=self._fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise EntryRejected("not a regular file")
        return os.fdopen(fd, "rb")

    def _read_small(self, name: str, limit: int) -> bytes:
        with self._open_regular(name) as f:
            data: bytes = f.read(limit + 1)
        if len(data) > limit:
            raise ValueError("too large to be an entry's JSON")
        return data

    def _data_is_ours(self, name: str) -> bool:
        """Whether a data file no JSON vouches for carries this identity in its header."""
        try:
            with self._open_regular(name) as f:
                header = read_header(f, os.fstat(f.fileno()).st_size)
        except (OSError, ValueError):
            return False
        return header.metadata.get("0.model") == self.identity

    def _unlink(self, name: str) -> None:
        """Remove `name` if it is a regular file under one of the names we write."""
        key = name.split(".", 1)[0]
        ours = TMP_NAME.fullmatch(name) or (
            KEY.fullmatch(key) and name in (f"{key}{META_SUFFIX}", f"{key}{DATA_SUFFIX}")
        )
        if ours and self._regular(name) is not None:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self._fd)

    def _remove(self, key: str) -> None:
        self._entries.pop(key, None)
        # The JSON first: without it the entry no longer exists for any reader.
        for suffix in (META_SUFFIX, DATA_SUFFIX):
            self._unlink(f"{key}{suffix}")


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
        self._tmp = f"{TMP_PREFIX}{self.key}-{os.getpid()}{DATA_SUFFIX}"
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
        self.disk._unlink(self._tmp)

    def _write(self, limit: int) -> None:
        if self._file is None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
            fd = os.open(self._tmp, flags, PRIVATE_FILE, dir_fd=self.disk._fd)
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


def _sha256(file: Any) -> str:
    digest = hashlib.sha256()
    for chunk in _blocks(file):
        digest.update(chunk)
    return digest.hexdigest()


def _blocks(file: Any) -> Iterator[bytes]:
    while chunk := file.read(1 << 20):
        yield chunk


def _token_list(value: object) -> TypeGuard[list[int]]:
    """Whether `value` is a list of token ids (ints in int64 range; not floats such as 1e400,
    not booleans)."""
    return isinstance(value, list) and all(type(t) is int and 0 <= t < 2**63 for t in value)
