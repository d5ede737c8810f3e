"""Robustness II, item 2: no file in the cache directory stops the server from starting.

A `*.json` that is valid JSON but not an entry (`[]`, `null`, a number, `1e400` tokens, …) used
to raise at start-up (`'list' object has no attribute 'get'`): `mlx serve` exited 70 and under
`mlx launch claude` every request got "no model is loaded"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_helpers import run

from mlxlaunch.engine.cache.disk import FORMAT, DiskCache
from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.types import ChatMessage, GenerationRequest

IDENTITY = "model-identity"
# Metadata files a cache directory may come to hold: valid JSON, none of them an entry.
NOT_ENTRIES: list[bytes] = [
    b"[]",
    b"null",
    b"1e400",
    b'"text"',
    b"true",
    b"[1, 2, 3]",
    b'{"tokens": [1e400]}',
    json.dumps({"format": FORMAT, "model": IDENTITY, "tokens": [1.5, 2]}).encode(),
    b'{"format": "x", "model": "y", "tokens": [true, false]}',
    b'{"format": '
    + json.dumps(FORMAT).encode()
    + b', "model": "'
    + IDENTITY.encode()
    + b'", "tokens": [99999999999999999999999999], "bytes": 1e400}',
    b'{"tokens": {"a": 1}}',
    b'{"tokens": ["\\ud800"]}',
]


@pytest.mark.parametrize("content", NOT_ENTRIES, ids=[str(i) for i in range(len(NOT_ENTRIES))])
def test_the_index_skips_what_is_not_an_entry(tmp_path: Path, content: bytes) -> None:
    directory = tmp_path / IDENTITY
    directory.mkdir()
    (directory / "junk.json").write_bytes(content)
    cache = DiskCache(tmp_path, IDENTITY, budget_bytes=1 << 20)  # must not raise
    assert cache.entries == []


@pytest.mark.slow
def test_the_engine_starts_and_answers_over_a_directory_of_junk(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    import asyncio

    request = GenerationRequest(messages=[ChatMessage(role="user", content="hi")], max_tokens=3)

    async def serve_once() -> None:
        engine = Engine(EngineConfig(model=str(tiny_model_dir), cache_dir=tmp_path))
        try:
            done, _ = await run(engine, request)
            assert done.stop_reason in ("end_turn", "max_tokens")
        finally:
            engine.close()

    asyncio.run(serve_once())  # creates the model's identity directory
    (identity_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    for number, content in enumerate(NOT_ENTRIES):
        (identity_dir / f"junk-{number}.json").write_bytes(content)
    asyncio.run(serve_once())  # starts, restores nothing broken, answers
