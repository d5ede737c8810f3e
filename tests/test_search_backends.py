"""The search backends against a real local HTTP server speaking SearXNG's and Brave's JSON:
results read from each API's shape, and every failure one of the tool's error codes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from search_fakes import BRAVE_TOKEN, HITS, FakeSearch, fake_search

from mlxlaunch.server.search_backends import (
    MAX_QUERY_CHARS,
    SearchBackend,
    SearchFailed,
    SearchResult,
)


@pytest.fixture(scope="module")
def service() -> Iterator[FakeSearch]:
    with fake_search() as fake:
        yield fake


@pytest.fixture
def fake(service: FakeSearch) -> FakeSearch:
    service.reset()
    return service


def _search(backend: SearchBackend, query: str) -> list[SearchResult]:
    return asyncio.run(backend.search(query))


def _code(backend: SearchBackend, query: str = "mlx") -> str:
    with pytest.raises(SearchFailed) as info:
        _search(backend, query)
    return info.value.code


def test_searxng_results(fake: FakeSearch) -> None:
    found = _search(SearchBackend("searxng", fake.url), "  mlx arrays ")
    assert fake.queries == ["mlx arrays"]
    assert [hit.url for hit in found] == [h["url"] for h in HITS]
    assert found[0] == SearchResult(
        HITS[0]["url"], HITS[0]["title"], HITS[0]["content"], "2026-11-30T00:00:00"
    )
    assert found[1].page_age is None


def test_brave_results_with_its_token(fake: FakeSearch) -> None:
    found = _search(SearchBackend("brave", fake.url, api_key=BRAVE_TOKEN), "mlx")
    assert [(hit.url, hit.title, hit.snippet) for hit in found] == [
        (h["url"], h["title"], h["content"]) for h in HITS
    ]
    assert found[0].page_age == "2026-11-30T00:00:00"
    assert _code(SearchBackend("brave", fake.url, api_key="wrong")) == "unavailable"


@pytest.mark.parametrize(("status", "code"), [(500, "unavailable"), (429, "too_many_requests")])
def test_backend_failures_are_tool_error_codes(fake: FakeSearch, status: int, code: str) -> None:
    fake.status = status
    assert _code(SearchBackend("searxng", fake.url)) == code


def test_a_slow_backend_times_out_as_unavailable(fake: FakeSearch) -> None:
    fake.delay_s = 1.0
    assert _code(SearchBackend("searxng", fake.url, timeout_s=0.2)) == "unavailable"


def test_an_unreachable_backend_is_unavailable() -> None:
    assert _code(SearchBackend("searxng", "http://127.0.0.1:9")) == "unavailable"


def test_bad_queries_never_reach_the_backend(fake: FakeSearch) -> None:
    backend = SearchBackend("searxng", fake.url)
    assert _code(backend, "   ") == "invalid_tool_input"
    assert _code(backend, "x" * (MAX_QUERY_CHARS + 1)) == "query_too_long"
    assert fake.queries == []
