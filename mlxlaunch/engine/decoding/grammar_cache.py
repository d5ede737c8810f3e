"""Compiled grammars remembered by their text, so an identical grammar is compiled once.

Claude Code sends the same tools (hence the same tool-call grammar) on every turn, and the
session-title schema on every session; compiling and warming one costs milliseconds to tens of
milliseconds each time. `GrammarCache` keeps the most recently used compiled grammars of one
tokenizer, bounded in count and in grammar text, and remembers refusals too, so a client that
repeats a grammar the engine cannot honour gets its 400 without the work being redone.

Concurrent requests for the same grammar compile it once: the first caller compiles, the others
wait for its result (single flight), so sixteen identical bombs cost one compilation.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from mlxlaunch.engine.types import InvalidRequest

T = TypeVar("T")

# A compiled template holds the grammar plus its lexer's caches; the grammar's text is the
# part we can measure, so the byte bound is on text. Tool grammars of a large agent are a few
# hundred kilobytes.
MAX_ENTRIES = 32
MAX_TEXT_BYTES = 16 << 20


@dataclass(frozen=True)
class _Entry(Generic[T]):
    value: T | None
    refusal: str | None  # the InvalidRequest message of a grammar that cannot be honoured
    size: int


class GrammarCache(Generic[T]):
    """An LRU of compiled grammars (or their refusals), keyed by grammar text."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_TEXT_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry[T]] = OrderedDict()
        self._bytes = 0
        self._compiling: dict[str, concurrent.futures.Future[T]] = {}
        self.compiled = 0  # compilations run (hits and waits do not count)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def get(self, grammar: str, compile: Callable[[], T]) -> T:
        """The compiled `grammar`: remembered, or compiled now by `compile`.

        Raises:
            InvalidRequest: `compile` refused the grammar (now or on an earlier call).
        """
        with self._lock:
            entry = self._entries.get(grammar)
            if entry is not None:
                self._entries.move_to_end(grammar)
                return _unwrap(entry)
            pending = self._compiling.get(grammar)
            if pending is None:
                pending = concurrent.futures.Future()
                self._compiling[grammar] = pending
                self.compiled += 1
                owner = True
            else:
                owner = False
        if not owner:
            try:
                return pending.result()
            except InvalidRequest as exc:  # a fresh exception per waiter: tracebacks differ
                raise InvalidRequest(str(exc)) from None
        try:
            value = compile()
        except InvalidRequest as exc:
            self._store(grammar, _Entry(None, str(exc), len(grammar)))
            pending.set_exception(exc)
            raise
        except BaseException as exc:  # not the grammar's fault: nothing is remembered
            pending.set_exception(exc)
            raise
        else:
            self._store(grammar, _Entry(value, None, len(grammar)))
            pending.set_result(value)
            return value
        finally:
            with self._lock:
                self._compiling.pop(grammar, None)

    def _store(self, grammar: str, entry: _Entry[T]) -> None:
        if entry.size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(grammar, None)
            if old is not None:
                self._bytes -= old.size
            self._entries[grammar] = entry
            self._bytes += entry.size
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.size


def _unwrap(entry: _Entry[T]) -> T:
    if entry.refusal is not None:
        raise InvalidRequest(entry.refusal)
    assert entry.value is not None
    return entry.value
