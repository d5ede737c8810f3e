"""Issue 35, items 3, 4 and 6: where stored conversations live, how much of them, and what.

Both stores (message threads, stored responses) keep their files through one mechanism
(server/conversation_files.py), checked here for each: the budget covers what is on disk
whoever wrote it (earlier runs included: scanned at start, expired, oldest deleted first), only
files the store recognises are counted or deleted, never through a symlink; `--cache-disk 0`
keeps them off disk; and a conversation keeps only what its prompt is made of, not another
server's opaque blobs.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.launch.serving import conversations_dir
from mlxlaunch.protocol.openai_responses import ReasoningItem
from mlxlaunch.protocol.requests import MessagesRequest
from mlxlaunch.protocol.responses import Message, ResponseTextBlock
from mlxlaunch.server.conversation_files import ThreadLimits
from mlxlaunch.server.response_store import ResponseStore
from mlxlaunch.server.threads import ThreadStore

KIB = 1024
BLOB = "x" * (2 * KIB)  # what makes one stored conversation ~2 KiB


def _thread_writer(directory: Path, limits: ThreadLimits) -> Callable[[int], str]:
    store = ThreadStore(limits, directory)

    def write(number: int) -> str:
        body = MessagesRequest.model_validate(
            {"model": "m", "max_tokens": 8, "thread": {"type": "create"},
             "messages": [{"role": "user", "content": BLOB}]}
        )  # fmt: skip
        _, turn = store.open(body)
        assert turn is not None
        reply_id = f"msg_{number:024x}"
        store.keep(turn, Message(id=reply_id, model="m", content=[ResponseTextBlock(text="ok")]))
        return reply_id

    return write


def _response_writer(directory: Path, limits: ThreadLimits) -> Callable[[int], str]:
    store = ResponseStore(limits, directory)

    def write(number: int) -> str:
        response_id = f"resp_{number:024x}"
        store.keep(response_id, [{"type": "message", "role": "user", "content": BLOB}])
        return response_id

    return write


STORES = {"threads": _thread_writer, "responses": _response_writer}


def _on_disk(directory: Path) -> tuple[int, int]:
    files = [p for p in directory.iterdir() if p.is_file() and not p.is_symlink()]
    return len(files), sum(p.stat().st_size for p in files)


# --- item 4: the budget covers what is on disk, whatever wrote it ------------------------


@pytest.mark.parametrize("kind", STORES)
def test_the_disk_budget_holds_across_restarts(kind: str, tmp_path: Path) -> None:
    limits = ThreadLimits(max_threads=1000, max_bytes=20 * KIB)
    directory = tmp_path / kind
    number = 0
    for _run in range(3):  # three server runs, each storing ~50 KiB against a 20 KiB budget
        write = STORES[kind](directory, limits)
        for _ in range(25):
            number += 1
            write(number)
        _, size = _on_disk(directory)
        assert size <= limits.max_bytes, f"{size} bytes on disk after restart {_run}"
    # The newest survive, the oldest went first.
    assert (directory / f"{write(number + 1)}.json").exists()
    assert not (directory / f"{'msg' if kind == 'threads' else 'resp'}_{1:024x}.json").exists()


@pytest.mark.parametrize("kind", STORES)
def test_an_earlier_runs_files_are_counted_expired_and_cut_at_start(
    kind: str, tmp_path: Path
) -> None:
    directory = tmp_path / kind
    write = STORES[kind](directory, ThreadLimits())
    ids = [write(n) for n in range(1, 11)]
    old = time.time() - 2 * 3600
    for conversation_id in ids[:4]:  # four of them unused for two hours
        os.utime(directory / f"{conversation_id}.json", (old, old))
    STORES[kind](directory, ThreadLimits(ttl_s=3600.0))  # a restart: nothing written yet
    assert {p.stem for p in directory.glob("*.json")} == set(ids[4:])
    STORES[kind](directory, ThreadLimits(max_threads=3))
    assert {p.stem for p in directory.glob("*.json")} == set(ids[-3:])  # oldest first


@pytest.mark.parametrize("kind", STORES)
def test_only_the_stores_own_files_are_counted_or_deleted(kind: str, tmp_path: Path) -> None:
    directory = tmp_path / kind
    directory.mkdir(mode=0o700)
    prefix = "msg" if kind == "threads" else "resp"
    outside = tmp_path / "precious.json"
    outside.write_text("{}")
    foreign = directory / f"{prefix}_{999:024x}.json"  # our name, not our marker
    foreign.write_text('{"not": "ours"}' + " " * 40 * KIB)
    (directory / f"{prefix}_{998:024x}.json").symlink_to(outside)
    (directory / "notes.txt").write_text("n" * 40 * KIB)
    unfinished = directory / f".{prefix}_{997:024x}.json.tmp"  # a crash mid-write
    unfinished.write_text("{")
    write = STORES[kind](directory, ThreadLimits(max_bytes=8 * KIB))
    assert not unfinished.exists()
    for number in range(1, 8):
        write(number)
    assert foreign.exists() and outside.read_text() == "{}" and (directory / "notes.txt").exists()
    assert (directory / f"{prefix}_{998:024x}.json").is_symlink()
    own = [p for p in directory.glob(f"{prefix}_*.json") if p not in (foreign,)]
    own = [p for p in own if not p.is_symlink()]
    assert 0 < sum(p.stat().st_size for p in own) <= 8 * KIB


def test_a_continued_response_outlives_newer_ones_on_disk(tmp_path: Path) -> None:
    directory = tmp_path / "responses"
    store = ResponseStore(ThreadLimits(max_threads=3), directory)
    store.keep(f"resp_{1:024x}", [{"type": "message", "role": "user", "content": "a"}])
    time.sleep(0.01)
    for number in (2, 3):
        store.keep(f"resp_{number:024x}", [{"type": "message", "role": "user", "content": "b"}])
    assert store.lookup(f"resp_{1:024x}") is not None  # continued: the newest now
    store.keep(f"resp_{4:024x}", [{"type": "message", "role": "user", "content": "c"}])
    restarted = ResponseStore(ThreadLimits(max_threads=3), directory)
    assert restarted.lookup(f"resp_{1:024x}") is not None
    assert restarted.lookup(f"resp_{2:024x}") is None


# --- item 3: --cache-disk 0 means nothing on disk ------------------------------------------


def test_conversations_are_kept_on_disk_only_with_a_disk_tier(tmp_path: Path) -> None:
    def config(disk: int, cache_dir: Path | None = tmp_path) -> EngineConfig:
        return EngineConfig(model="m", cache_dir=cache_dir, cache_disk_bytes=disk)

    assert conversations_dir(config(0)) is None
    assert conversations_dir(config(10**9, None)) is None
    assert conversations_dir(config(10**9)) == tmp_path / "threads"


# --- item 6: only what the prompt is made of is kept ---------------------------------------

OPAQUE = "E" * (3 * 1024 * 1024)  # 3 MB of another server's encrypted reasoning


def test_a_thread_keeps_no_redacted_thinking_or_signatures(tmp_path: Path) -> None:
    store = ThreadStore(directory=tmp_path / "threads")
    body = MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 8,
            "thread": {"type": "create"},
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [
                    {"type": "redacted_thinking", "data": OPAQUE},
                    {"type": "thinking", "thinking": "let me see", "signature": OPAQUE},
                    {"type": "text", "text": "hello"},
                ]},
                {"role": "user", "content": "again"},
            ],
        }
    )  # fmt: skip
    _, turn = store.open(body)
    assert turn is not None
    store.keep(turn, Message(id=f"msg_{1:024x}", model="m", content=[ResponseTextBlock(text="k")]))
    [saved] = (tmp_path / "threads").glob("msg_*.json")
    assert saved.stat().st_size < 2 * KIB
    assert "let me see" in saved.read_text()  # what the prompt renders is kept
    continued = MessagesRequest.model_validate(
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "more"}],
         "thread": {"type": "continue", "previous_message_id": f"msg_{1:024x}"}}
    )  # fmt: skip
    whole, _ = ThreadStore(directory=tmp_path / "threads").open(continued)
    assert [m.role for m in whole.messages] == ["user", "assistant", "user", "assistant", "user"]


def test_a_stored_response_keeps_no_encrypted_content() -> None:
    item = ReasoningItem.model_validate(
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "why"}],
         "encrypted_content": OPAQUE}
    )  # fmt: skip
    assert item.encrypted_content == OPAQUE  # read (and ignored) as before
    dumped: dict[str, Any] = item.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert "encrypted_content" not in dumped and len(json.dumps(dumped)) < 200
