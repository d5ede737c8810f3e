"""The thread store on its own: linear threads, in-flight continues, budgets and TTL, and its
files — kept across a restart, never a symlink followed or a file it did not write deleted."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from mlxlaunch.protocol.requests import MessagesRequest
from mlxlaunch.protocol.responses import Message, ResponseTextBlock
from mlxlaunch.server.errors import ApiError
from mlxlaunch.server.threads import ThreadLimits, ThreadStore


def _body(text: str, thread: dict[str, Any] | None, **extra: Any) -> MessagesRequest:
    return MessagesRequest.model_validate(
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": text}],
         "thread": thread, **extra}
    )  # fmt: skip


def _reply(number: int, text: str) -> Message:
    return Message(id=f"msg_{number:024x}", model="m", content=[ResponseTextBlock(text=text)])


def _code(exc: pytest.ExceptionInfo[ApiError]) -> str:
    assert exc.value.details is not None
    code = str(exc.value.details["error_code"])
    assert exc.value.status == (404 if code == "thread_not_found" else 400)
    return code


def _continue(tip: str) -> dict[str, Any]:
    return {"type": "continue", "previous_message_id": tip}


def test_a_continue_runs_the_whole_conversation_with_the_threads_system_and_tools() -> None:
    store = ThreadStore()
    tool = {"name": "t", "input_schema": {"type": "object"}}
    body, turn = store.open(_body("one", {"type": "create"}, system="be brief", tools=[tool]))
    assert turn is not None and body.thread is not None
    store.keep(turn, _reply(1, "first"))
    body, turn = store.open(_body("two", _continue(f"msg_{1:024x}")))
    assert turn is not None and body.thread is None
    assert [m.role for m in body.messages] == ["user", "assistant", "user"]
    assert body.system is not None and body.system[0].text == "be brief"
    assert body.tools is not None and body.tools[0].name == "t"


def test_threads_are_linear_and_one_continue_runs_at_a_time() -> None:
    store = ThreadStore()
    _, turn = store.open(_body("one", {"type": "create"}))
    assert turn is not None
    store.keep(turn, _reply(1, "first"))
    tip = f"msg_{1:024x}"
    _, running = store.open(_body("two", _continue(tip)))
    with pytest.raises(ApiError) as busy:
        store.open(_body("two again", _continue(tip)))
    assert _code(busy) == "thread_continue_in_flight"
    assert running is not None
    store.release(running)  # failed: the tip can be continued again
    _, running = store.open(_body("two", _continue(tip)))
    assert running is not None
    store.keep(running, _reply(2, "second"))
    with pytest.raises(ApiError) as twice:
        store.open(_body("branch", _continue(tip)))
    assert _code(twice) == "thread_already_continued"


def test_budgets_and_ttl_forget_threads_least_recently_used_first() -> None:
    now = [1000.0]
    store = ThreadStore(ThreadLimits(max_threads=2, ttl_s=60.0), clock=lambda: now[0])
    for number in (1, 2, 3):
        _, turn = store.open(_body("x", {"type": "create"}))
        assert turn is not None
        store.keep(turn, _reply(number, "y"))
    with pytest.raises(ApiError) as gone:
        store.open(_body("z", _continue(f"msg_{1:024x}")))
    assert _code(gone) == "thread_not_found"
    now[0] += 61
    with pytest.raises(ApiError) as expired:
        store.open(_body("z", _continue(f"msg_{3:024x}")))
    assert _code(expired) == "thread_not_found"


def test_threads_survive_a_restart_in_their_directory(tmp_path: Path) -> None:
    first = ThreadStore(directory=tmp_path / "threads")
    _, turn = first.open(_body("one", {"type": "create"}))
    assert turn is not None
    first.keep(turn, _reply(7, "kept"))
    assert (tmp_path / "threads").stat().st_mode & 0o777 == 0o700
    files = list((tmp_path / "threads").iterdir())
    assert [f.name for f in files] == [f"msg_{7:024x}.json"]
    assert files[0].stat().st_mode & 0o777 == 0o600
    second = ThreadStore(directory=tmp_path / "threads")
    body, turn = second.open(_body("two", _continue(f"msg_{7:024x}")))
    assert turn is not None
    assert [m.role for m in body.messages] == ["user", "assistant", "user"]


def test_the_store_deletes_only_its_own_files_and_follows_no_symlink(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / f"msg_{5:024x}.json").write_text('{"format": "x"}')
    linked = tmp_path / "linked"
    linked.symlink_to(elsewhere)
    store = ThreadStore(ThreadLimits(max_threads=1), directory=linked)
    for number in (1, 2):
        _, turn = store.open(_body("x", {"type": "create"}))
        assert turn is not None
        store.keep(turn, _reply(number, "y"))
    assert sorted(os.listdir(elsewhere)) == [f"msg_{5:024x}.json"]  # a symlinked dir: unused

    own = tmp_path / "own"
    own.mkdir()
    foreign = own / f"msg_{9:024x}.json"
    foreign.write_text('{"not": "ours"}')
    (own / "notes.json").write_text("{}")
    target = tmp_path / "secret.json"
    target.write_text('{"format": "mlxlaunch-thread-1"}')
    (own / f"msg_{8:024x}.json").symlink_to(target)
    store = ThreadStore(ThreadLimits(max_threads=1), directory=own)
    for tip in (f"msg_{9:024x}", f"msg_{8:024x}"):
        with pytest.raises(ApiError) as refused:
            store.open(_body("x", _continue(tip)))
        assert _code(refused) == "thread_not_found"
    for number in (1, 2, 3):
        _, turn = store.open(_body("x", {"type": "create"}))
        assert turn is not None
        store.keep(turn, _reply(number, "y"))
    assert foreign.read_text() == '{"not": "ours"}'
    assert (own / "notes.json").exists() and target.exists()
    assert (own / f"msg_{3:024x}.json").exists() and not (own / f"msg_{1:024x}.json").exists()
