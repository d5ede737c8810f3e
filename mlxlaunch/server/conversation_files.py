"""Conversations kept as files (message threads, stored responses), held to their budget.

One directory per store (beside the disk KV cache, only when there is a disk tier). What is
in it counts against the store's budget whoever wrote it (this process, an earlier run, a
crash): the directory is scanned when the store opens, files past the TTL are deleted, and
the oldest go first until the count and bytes fit — at start and after every write.

The directory is data: only regular files named as the store names them (`<id>.json`, the id
matching the store's own pattern) whose first bytes carry the store's format marker are
counted, read or deleted; symlinks are never followed, other files are left alone. Reads are
bounded (a file larger than the budget is not a conversation this store wrote).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import stat
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxlaunch.home import private_dir

log = logging.getLogger("mlxlaunch.server")

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_SUFFIX = ".json"
_TEMP = re.compile(r"\.(?P<id>.+)\.json\.tmp")  # a write this store began and never finished


@dataclass(frozen=True)
class ThreadLimits:
    """How much a conversation store keeps (in memory, and the same again on disk).

    Args:
        max_threads: most conversations held (least recently used go first).
        max_bytes: most bytes of conversation JSON held in memory and on disk.
        ttl_s: a conversation unused this long is forgotten (its next turn replays).
    """

    max_threads: int = 512
    max_bytes: int = 256 * 1024 * 1024
    ttl_s: float = 24 * 3600.0


def marker(format_name: str) -> bytes:
    """How every file of a store begins (`json.dumps` of a dict whose first key is `format`)."""
    return b'{"format": "' + format_name.encode() + b'"'


class ConversationFiles:
    """The files of one store: an index of id → (time, bytes), oldest first, under a budget.

    Args:
        directory: where the files live; None (or a directory that cannot be used) keeps
            nothing on disk, and every method is then a no-op.
        limits: the budget on disk (files, bytes, TTL).
        format_name: the marker the store writes first in each file.
        own_id: the ids the store names files by (anything else in the directory is ignored).
        clock: wall-clock time (the index compares it with file modification times).
        what: the store's name in log lines ("threads", "responses").
    """

    def __init__(
        self,
        directory: Path | None,
        limits: ThreadLimits,
        *,
        format_name: str,
        own_id: re.Pattern[str],
        clock: Callable[[], float],
        what: str,
    ) -> None:
        self._marker = marker(format_name)
        self._own_id = own_id
        self.max_files, self.max_bytes = limits.max_threads, limits.max_bytes
        self.ttl_s = limits.ttl_s
        self._clock = clock
        self._what = what
        self.index: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self.directory = self._usable(directory)
        if self.directory is not None:
            self._scan()
            self.enforce()

    @property
    def nbytes(self) -> int:
        return sum(size for _, size in self.index.values())

    def __contains__(self, conversation_id: str) -> bool:
        return conversation_id in self.index

    # --- the budget ---------------------------------------------------------------------

    def enforce(self, keep: frozenset[str] = frozenset()) -> None:
        """Delete files past the TTL, then the oldest until count and bytes fit (`keep`:
        ids in use that must stay, e.g. a thread being continued)."""
        cutoff = self._clock() - self.ttl_s
        for conversation_id, (used, _) in list(self.index.items()):
            if used < cutoff and conversation_id not in keep:
                self.delete(conversation_id)
        total = self.nbytes
        for conversation_id, (_, size) in list(self.index.items()):
            if len(self.index) <= self.max_files and total <= self.max_bytes:
                break
            if conversation_id in keep:
                continue
            self.delete(conversation_id)
            total -= size

    # --- files --------------------------------------------------------------------------

    def path(self, conversation_id: str) -> Path | None:
        if self.directory is None or not self._own_id.fullmatch(conversation_id):
            return None
        return self.directory / f"{conversation_id}{_SUFFIX}"

    def read(self, conversation_id: str) -> tuple[Any, int] | None:
        """The parsed JSON of a file the index holds and its size, or None (a file that is
        not one of this store's leaves the index)."""
        path = self.path(conversation_id)
        if path is None or conversation_id not in self.index:
            return None
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
            with os.fdopen(fd, "rb") as handle:
                if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                    raise OSError(0, "not a regular file")
                raw = handle.read(self.max_bytes + 1)
            if len(raw) > self.max_bytes or not raw.startswith(self._marker):
                raise ValueError("not a file of this store")
            return json.loads(raw), len(raw)
        except (OSError, ValueError) as exc:
            log.info("%s: %s is unreadable (%s); ignored", self._what, path.name, exc)
            self.index.pop(conversation_id, None)
            return None

    def write(self, conversation_id: str, text: str) -> bool:
        """Save `text` (which starts with the marker) atomically, private; then the budget."""
        path = self.path(conversation_id)
        if path is None:
            return False
        data = text.encode()
        temp = path.with_name(f".{path.name}.tmp")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(temp, path)
        except OSError as exc:
            log.warning(
                "%s: could not save %s (%s); it is kept in memory only", self._what, path.name, exc
            )
            return False
        self.index[conversation_id] = (self._clock(), len(data))
        self.index.move_to_end(conversation_id)
        self.enforce(frozenset({conversation_id}))
        return True

    def touch(self, conversation_id: str) -> None:
        """The conversation was used: it becomes the newest (on disk too, across restarts)."""
        path = self.path(conversation_id)
        if path is None or conversation_id not in self.index:
            return
        now = self._clock()
        with contextlib.suppress(OSError, NotImplementedError):
            os.utime(path, (now, now), follow_symlinks=False)
        self.index[conversation_id] = (now, self.index[conversation_id][1])
        self.index.move_to_end(conversation_id)

    def delete(self, conversation_id: str) -> None:
        """Forget the file, and remove it if it is still a regular file of this store."""
        if self.index.pop(conversation_id, None) is None:
            return
        path = self.path(conversation_id)
        if path is not None and self._is_ours(path):
            with contextlib.suppress(OSError):
                path.unlink()

    # --- the directory ------------------------------------------------------------------

    def _usable(self, directory: Path | None) -> Path | None:
        """`directory`, created private, unless it is (or cannot be made) a real directory."""
        if directory is None:
            return None
        try:
            private_dir(directory)  # and missing parents: 0700 whatever the umask
            if not stat.S_ISDIR(directory.lstat().st_mode):
                raise OSError("not a directory (a symlink is not followed)")
        except OSError as exc:
            log.warning("%s: %s is unusable (%s); kept in memory only", self._what, directory, exc)
            return None
        return directory

    def _scan(self) -> None:
        """Index what an earlier run left, oldest first; its unfinished writes are removed."""
        assert self.directory is not None
        try:
            entries = list(os.scandir(self.directory))
        except OSError as exc:
            log.warning(
                "%s: cannot list %s (%s); kept in memory only", self._what, self.directory, exc
            )
            self.directory = None
            return
        found: list[tuple[float, str, int]] = []
        for entry in entries:
            name = entry.name
            temp = _TEMP.fullmatch(name)
            if temp is not None and self._own_id.fullmatch(temp["id"]):
                if self._is_ours(Path(entry.path), marked=False):
                    Path(entry.path).unlink(missing_ok=True)
                continue
            if not name.endswith(_SUFFIX) or not self._own_id.fullmatch(name[: -len(_SUFFIX)]):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and self._is_ours(Path(entry.path)):
                found.append((info.st_mtime, name[: -len(_SUFFIX)], info.st_size))
        for mtime, conversation_id, size in sorted(found):
            self.index[conversation_id] = (mtime, size)

    def _is_ours(self, path: Path, *, marked: bool = True) -> bool:
        """A regular file (never through a symlink) that starts with this store's marker
        (`marked=False`: any regular file, for our own unfinished temp files)."""
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return False
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return False
            return not marked or handle.read(len(self._marker)) == self._marker
