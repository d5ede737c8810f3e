"""Issue 35, items 3 and 6 through the real serving lifetime (`launch/serving.py`), the tiny
model and the official SDKs: `--cache-disk 0` writes no conversation under the cache dir, and
with a disk tier a stored conversation keeps only what its prompt is made of."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anthropic
import openai
import pytest
from rich.console import Console

from mlxlaunch.launch.models import ChosenModel
from mlxlaunch.launch.serving import EngineOptions, Serving, serving
from mlxlaunch.server.app import ServerSettings

pytestmark = pytest.mark.slow

OPAQUE = "E" * (3 * 1024 * 1024)  # another server's encrypted reasoning, 3 MB


@contextmanager
def served(model: Path, tmp: Path, cache_disk: str) -> Iterator[Serving]:
    with serving(
        ChosenModel("tiny", model, "--model"),
        EngineOptions(cache_dir=tmp / "cache", cache_disk=cache_disk),
        ServerSettings(auth_token="tok"),
        kind="serve",
        console=Console(file=io.StringIO()),
        load="now",
    ) as serve:
        yield serve


def _converse(url: str) -> None:
    """A stored response and its continuation; a thread and its continuation."""
    responses = openai.OpenAI(base_url=url + "/v1", api_key="tok", max_retries=0)
    first = responses.responses.create(
        model="local",
        input=[
            {"type": "message", "role": "user", "content": "hi"},
            {"type": "reasoning", "summary": [], "encrypted_content": OPAQUE},
            {"type": "message", "role": "assistant", "content": "hello"},
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            {"type": "message", "role": "user", "content": "again"},
        ],
        max_output_tokens=8,
    )
    responses.responses.create(
        model="local", input="again", previous_response_id=first.id, max_output_tokens=8
    )
    threads = anthropic.Anthropic(base_url=url, api_key="tok", max_retries=0)
    reply = threads.messages.create(
        model="local",
        max_tokens=4,
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [
                {"type": "redacted_thinking", "data": OPAQUE},
                {"type": "thinking", "thinking": "hm", "signature": OPAQUE},
                {"type": "text", "text": "hello"},
            ]},
            {"role": "user", "content": "again"},
        ],  # type: ignore[misc, list-item]
        extra_body={"thread": {"type": "create"}},
    )  # fmt: skip
    threads.messages.create(
        model="local",
        max_tokens=4,
        messages=[{"role": "user", "content": "more"}],
        extra_body={"thread": {"type": "continue", "previous_message_id": reply.id}},
    )


def _conversation_files(cache: Path) -> list[Path]:
    return [p for d in ("threads", "responses") for p in (cache / d).glob("*.json")]


def test_cache_disk_zero_keeps_conversations_in_memory(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    with served(tiny_model_dir, tmp_path, "0") as serve:
        _converse(serve.url)  # continuations work from memory
    files = _conversation_files(tmp_path / "cache")
    print(f"--cache-disk 0: {len(files)} conversation files written")
    assert files == []


def test_a_stored_conversation_keeps_only_what_its_prompt_is_made_of(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    with served(tiny_model_dir, tmp_path, "1GB") as serve:
        _converse(serve.url)
    files = _conversation_files(tmp_path / "cache")
    sizes = {p.parent.name: p.stat().st_size for p in files}
    print(f"stored for a few-token request with 3 MB opaque fields: {sizes}")
    assert {p.parent.name for p in files} == {"threads", "responses"}
    assert all(p.stat().st_size < 16 * 1024 for p in files)
    assert not any("web_search_call" in p.read_text() for p in files)
