"""Engine errors reach clients through one table (server/errors.py): each type's status, error
type, retry headers and log line, through a real server and the Anthropic SDK.

The engine is a stand-in that raises the error (only the `ServingEngine` boundary is faked);
one test runs a real engine whose model cannot load, the case that used to be a bare 500 with a
traceback in the log.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from stream_grammar import check_stream

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.decoding.grammar import ConstraintBroken
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.types import (
    Admitted,
    ClusterLost,
    EngineError,
    EngineEvent,
    EngineUnavailable,
    GenerationFailed,
    GenerationRequest,
    InvalidRequest,
    ModelInfo,
    Overloaded,
    PromptTooLong,
    TextDelta,
)
from mlxlaunch.protocol.sse import parse_frames
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.errors import ENGINE_ERRORS, UNEXPECTED_MESSAGE
from mlxlaunch.server.runner import ServerHandle, start_server


class RaisingEngine:
    """Yields `before`, then raises `error`, for every request and every token count."""

    def __init__(self) -> None:
        self.error: Exception = EngineError("unset")
        self.before: list[EngineEvent] = []

    @property
    def model_info(self) -> ModelInfo | None:
        return ModelInfo(id="raising", path="/nowhere", context_window=4096)

    def model_info_for(self, model_id: str) -> ModelInfo | None:
        return self.model_info

    async def submit(self, req: GenerationRequest) -> AsyncIterator[EngineEvent]:
        for event in self.before:
            yield event
        raise self.error

    def cancel(self, request_id: str) -> None:
        pass

    async def count_tokens(self, req: GenerationRequest) -> int:
        raise self.error


@pytest.fixture
def raising() -> Iterator[tuple[RaisingEngine, ServerHandle]]:
    engine = RaisingEngine()
    server = start_server(engine, ServerSettings(heartbeat_s=0.05, admission_grace_s=1.0))
    try:
        yield engine, server
    finally:
        server.stop()


def _client(server: ServerHandle) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=10)


HI: Any = [{"role": "user", "content": "hi"}]

# (error the engine raises, HTTP status, error type, message the client reads, log level)
CASES = [
    pytest.param(
        PromptTooLong(5000, 4096),
        400,
        "invalid_request_error",
        "prompt is too long: 5000 tokens > 4096 maximum",  # the wording clients recognise
        None,
        id="prompt-too-long",
    ),
    pytest.param(
        InvalidRequest("tool_choice names tool 'x', which is not offered"),
        400,
        "invalid_request_error",
        "tool_choice names tool 'x', which is not offered",
        None,
        id="invalid-request",
    ),
    pytest.param(
        Overloaded("the engine's queue is full (64 requests)", retry_after=7),
        429,
        "rate_limit_error",
        "the engine's queue is full (64 requests)",
        None,
        id="overloaded",
    ),
    pytest.param(
        EngineUnavailable("the model could not be loaded: no config.json"),
        503,
        "api_error",
        "the model could not be loaded: no config.json",
        logging.WARNING,
        id="engine-unavailable",
    ),
    pytest.param(
        GenerationFailed("not enough memory for this request"),
        500,
        "api_error",
        "generation failed: not enough memory for this request",
        logging.ERROR,
        id="generation-failed",
    ),
    pytest.param(
        EngineError("an engine error without a row of its own"),
        500,
        "api_error",
        "an engine error without a row of its own",
        logging.ERROR,
        id="engine-error",
    ),
]


def _call(client: anthropic.Anthropic, route: str) -> None:
    if route == "create":
        client.messages.create(model="m", max_tokens=5, messages=HI)
    elif route == "stream":
        with client.messages.stream(model="m", max_tokens=5, messages=HI) as stream:
            stream.get_final_message()
    else:
        client.messages.count_tokens(model="m", messages=HI)


# Engine errors answered by their base class's row, on purpose.
# PromptTooLong: an InvalidRequest with a wording of its own; ConstraintBroken: a generation
# that left its grammar mid-way fails as any other generation does (the grammar was valid).
# A lost rank is the engine being unavailable (503), said in its own words.
SHARE_THEIR_BASE_ROW = {PromptTooLong, ConstraintBroken, ClusterLost}


def test_every_engine_error_type_has_a_row() -> None:
    kinds = [kind for kind, _ in ENGINE_ERRORS]
    assert set(kinds) == {EngineError, *_subclasses(EngineError)} - SHARE_THEIR_BASE_ROW
    # First match wins: a subclass listed after its base would never be reached.
    for position, kind in enumerate(kinds):
        assert not any(issubclass(kind, earlier) for earlier in kinds[:position]), kind


def _subclasses(kind: type) -> set[type]:
    found: set[type] = set()
    for sub in kind.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


@pytest.mark.parametrize("route", ["create", "stream", "count_tokens"])
@pytest.mark.parametrize(("error", "status", "error_type", "message", "log_level"), CASES)
def test_engine_errors_get_their_status_and_type(
    raising: tuple[RaisingEngine, ServerHandle],
    caplog: pytest.LogCaptureFixture,
    route: str,
    error: Exception,
    status: int,
    error_type: str,
    message: str,
    log_level: int | None,
) -> None:
    engine, server = raising
    engine.error = error
    with (
        caplog.at_level(logging.INFO, logger="mlxlaunch.server"),
        pytest.raises(anthropic.APIStatusError) as raised,
    ):
        _call(_client(server), route)
    assert raised.value.status_code == status
    assert raised.value.body == {"type": "error", "error": {"type": error_type, "message": message}}
    headers = raised.value.response.headers
    if isinstance(error, Overloaded):
        assert headers["retry-after"] == "7" and headers["x-should-retry"] == "true"
    else:
        assert "retry-after" not in headers
    records = [r for r in caplog.records if r.name == "mlxlaunch.server"]
    assert not any(r.exc_info for r in records), "an engine error is not a bug: no traceback"
    reported = [r for r in records if message in r.getMessage() and "failed" in r.getMessage()]
    assert [r.levelno for r in reported] == ([log_level] if log_level is not None else [])


def test_an_engine_error_mid_stream_is_an_error_event_of_its_type(
    raising: tuple[RaisingEngine, ServerHandle],
) -> None:
    engine, server = raising
    engine.before = [Admitted("r", 3, 0, 5), TextDelta("partial")]
    engine.error = EngineUnavailable("the engine is shutting down")
    body = {"model": "m", "max_tokens": 5, "messages": HI, "stream": True}
    response = httpx.post(server.url + "/v1/messages", json=body, timeout=10)
    assert response.status_code == 200  # the stream had begun: the error comes as an event
    summary = check_stream(parse_frames(response.text))
    assert summary.error == {"type": "api_error", "message": "the engine is shutting down"}


def test_an_unexpected_error_is_a_500_with_its_traceback_in_the_log(
    raising: tuple[RaisingEngine, ServerHandle], caplog: pytest.LogCaptureFixture
) -> None:
    engine, server = raising
    engine.error = KeyError("a bug")
    with (
        caplog.at_level(logging.INFO, logger="mlxlaunch.server"),
        pytest.raises(anthropic.InternalServerError) as raised,
    ):
        _call(_client(server), "create")
    assert raised.value.status_code == 500
    assert raised.value.body == {
        "type": "error",
        "error": {"type": "api_error", "message": UNEXPECTED_MESSAGE},  # the bug's text stays
    }
    assert any(r.exc_info for r in caplog.records if r.name == "mlxlaunch.server")


def test_a_model_that_cannot_load_is_a_503_that_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = Engine(EngineConfig(model=str(tmp_path / "nowhere")))
    engine.start()
    try:
        with (
            start_server(engine) as server,
            caplog.at_level(logging.INFO, logger="mlxlaunch.server"),
            pytest.raises(anthropic.APIStatusError) as raised,
        ):
            _call(_client(server), "create")
    finally:
        engine.close()
    assert raised.value.status_code == 503
    body: Any = raised.value.body
    assert body["error"]["type"] == "api_error"
    # Clients with the token may be several: the model's path stays in the server's log.
    assert body["error"]["message"] == "the model could not be loaded (the server log says why)"
    assert str(tmp_path) not in str(body)
    assert not any(r.exc_info for r in caplog.records)
