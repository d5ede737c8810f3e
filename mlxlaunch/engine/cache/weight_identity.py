"""The model identity that names a disk cache directory: equal identities mean equal KV.

Made of the weights' content (a SHA-256 of each weight file), the config, the cache classes
and the versions that lay KV out, so weights rebuilt with the same shapes at the same path get
a new identity and never reuse the old KV, while the same model found at another path keeps
its own. Hashing is paid once per file: digests are remembered in a small memo file under the
cache root, by path, size, mtime, ctime and inode, so a restart rehashes nothing unchanged.

A file is hashed in 64 MiB chunks, in parallel (hashlib releases the GIL): its digest is the
SHA-256 of the chunks' digests. SHA-256 rather than BLAKE2b: measured on a busy 2-core x86
box, 1.34 GB/s against 0.68 GB/s per core (hardware SHA extensions, as on Apple silicon).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import logging
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx_lm

# Changes whenever what an identity covers or how entries are laid out changes.
IDENTITY_SCHEME = "weights-sha256/2"
MEMO_FILE = "weight-digests.json"
MEMO_FORMAT = {"writer": "mlxlaunch", "format": 1}  # a file without it is not our memo
MEMO_LIMIT = 512  # files remembered; the oldest are forgotten beyond it
MAX_MEMO_BYTES = 1 << 20
CHUNK_BYTES = 64 << 20
READ_BYTES = 8 << 20
PRIVATE_FILE = 0o600

log = logging.getLogger(__name__)


def model_identity(
    model_path: str | Path, cache_classes: Sequence[str], memo_dir: Path | None = None
) -> str:
    """A digest naming the model's weights and cache layout (24 hex digits).

    `memo_dir` (the cache root) keeps weight digests between processes; without it every call
    hashes every weight file.
    """
    digest = hashlib.sha256(f"{IDENTITY_SCHEME};mlx_lm={mlx_lm.__version__}".encode())
    root = Path(model_path)
    config = root / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    memo = DigestMemo(memo_dir)
    for weights in sorted(root.glob("*.safetensors")):
        digest.update(f"{weights.name}:{memo.digest(weights)};".encode())
    memo.save()
    digest.update(",".join(cache_classes).encode())
    return digest.hexdigest()[:24]


def file_digest(path: Path) -> str:
    """SHA-256 over the SHA-256 digests of `path`'s 64 MiB chunks, hashed in parallel."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        starts = range(0, max(size, 1), CHUNK_BYTES)
        workers = min(len(starts), os.cpu_count() or 1, 8)
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            chunks = list(pool.map(lambda start: _chunk_digest(fd, start, size), starts))
    finally:
        os.close(fd)
    whole = hashlib.sha256(f"size={size};".encode())
    for chunk in chunks:
        whole.update(chunk)
    return whole.hexdigest()


def _chunk_digest(fd: int, start: int, size: int) -> bytes:
    digest = hashlib.sha256()
    end = min(start + CHUNK_BYTES, size)
    position = start
    while position < end:
        data = os.pread(fd, min(READ_BYTES, end - position), position)
        if not data:
            raise OSError(f"file shrank while hashed at {position}")
        digest.update(data)
        position += len(data)
    return digest.digest()


class DigestMemo:
    """Weight digests remembered under a cache root, keyed by what changes with a rewrite.

    The memo is data like any file under the cache root: anything unreadable in it is
    forgotten, never trusted; a memo that cannot be written costs a rehash next time.
    """

    def __init__(self, directory: Path | None) -> None:
        self.path = directory / MEMO_FILE if directory is not None else None
        self._ours = True  # False: something else lies at our name, left alone
        self._known: dict[str, dict[str, Any]] = self._read()
        self._changed = False

    def digest(self, path: Path) -> str:
        """`path`'s content digest: remembered if the file is unchanged, else hashed now."""
        resolved = str(path.resolve())
        found = os.stat(resolved)  # weights may be links into a hub cache: followed
        stamp = {
            "size": found.st_size,
            "mtime_ns": found.st_mtime_ns,
            "ctime_ns": found.st_ctime_ns,
            "inode": found.st_ino,
            "device": found.st_dev,
        }
        known = self._known.get(resolved)
        if known is not None and all(known.get(k) == v for k, v in stamp.items()):
            digest = known.get("sha256")
            if isinstance(digest, str) and len(digest) == 64:
                return digest
        digest = file_digest(Path(resolved))
        self._known.pop(resolved, None)  # re-added last: the most recently hashed
        self._known[resolved] = {**stamp, "sha256": digest}
        self._changed = True
        return digest

    def save(self) -> None:
        """Write the memo back if it changed (atomically; never over a file that is not our
        memo, nor through a symlink)."""
        if self.path is None or not self._changed or not self._ours:
            return
        kept = dict(list(self._known.items())[-MEMO_LIMIT:])
        tmp = self.path.with_name(f".tmp-{MEMO_FILE}-{os.getpid()}")
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)  # our own leftover (same pid): the name is ours
            with os.fdopen(os.open(tmp, flags, PRIVATE_FILE), "w", encoding="utf-8") as f:
                json.dump({**MEMO_FORMAT, "files": kept}, f)
            os.replace(tmp, self.path)
        except OSError as exc:
            log.debug("weight digests not remembered in %s: %s", self.path, exc)
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def _read(self) -> dict[str, dict[str, Any]]:
        if self.path is None:
            return {}
        try:
            # Not through a symlink; a FIFO put there must not block the start.
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return {}
        except OSError:
            self._ours = False  # a symlink, or unreadable: not ours to replace
            return {}
        try:
            with os.fdopen(fd, "rb") as f:
                raw = f.read(MAX_MEMO_BYTES + 1) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
            memo = json.loads(raw.decode("utf-8")) if len(raw) <= MAX_MEMO_BYTES else None
        except (OSError, ValueError, RecursionError):
            memo = None
        ours = isinstance(memo, dict) and all(memo.get(k) == v for k, v in MEMO_FORMAT.items())
        files = memo.get("files") if isinstance(memo, dict) else None
        if not ours or not isinstance(files, dict):
            self._ours = False
            return {}
        return {k: v for k, v in files.items() if isinstance(v, dict)}
