"""The search backends against a real local HTTP server speaking SearXNG's and Brave's JSON:
results read from each API's shape, and every failure one of the tool's error codes."""

from __future__ import annotations

import asyncio

import pytest
from search_fakes import BRAVE_TOKEN, HITS, FakeSearch

from mlxlaunch.server.search_backends import (
    MAX_QUERY_CHARS,
    SearchBackend,
    SearchFailed,
    SearchResult,
)


def _search(backend: SearchBackend, query: str) -> list[SearchResult]:
    return asyncio.run(backend.search(query))


def _code(backend: SearchBackend, query: str = "mlx") -> str:
    with pytest.raises(SearchFailed) as info:
        _search(backend, query)
    return info.value.code


def test_searxng_results(search_service: FakeSearch) -> None:
    found = _search(SearchBackend("searxng", search_service.url), "  mlx arrays ")
    assert search_service.queries == ["mlx arrays"]
    assert [hit.url for hit in found] == [h["url"] for h in HITS]
    assert found[0] == SearchResult(
        HITS[0]["url"], HITS[0]["title"], HITS[0]["content"], "2026-11-30T00:00:00"
    )
    assert found[1].page_age is None


def test_brave_results_with_its_token(search_service: FakeSearch) -> None:
    found = _search(SearchBackend("brave", search_service.url, api_key=BRAVE_TOKEN), "mlx")
    assert [(hit.url, hit.title, hit.snippet) for hit in found] == [
        (h["url"], h["title"], h["content"]) for h in HITS
    ]
    assert found[0].page_age == "2026-11-30T00:00:00"
    assert _code(SearchBackend("brave", search_service.url, api_key="wrong")) == "unavailable"


@pytest.mark.parametrize(("status", "code"), [(500, "unavailable"), (429, "too_many_requests")])
def test_backend_failures_are_tool_error_codes(
    search_service: FakeSearch, status: int, code: str
) -> None:
    search_service.status = status
    assert _code(SearchBackend("searxng", search_service.url)) == code


def test_a_slow_backend_times_out_as_unavailable(search_service: FakeSearch) -> None:
    search_service.delay_s = 1.0
    assert _code(SearchBackend("searxng", search_service.url, timeout_s=0.2)) == "unavailable"


def test_an_unreachable_backend_is_unavailable() -> None:
    assert _code(SearchBackend("searxng", "http://127.0.0.1:9")) == "unavailable"


def test_bad_queries_never_reach_the_backend(search_service: FakeSearch) -> None:
    backend = SearchBackend("searxng", search_service.url)
    assert _code(backend, "   ") == "invalid_tool_input"
    assert _code(backend, "x" * (MAX_QUERY_CHARS + 1)) == "query_too_long"
    assert search_service.queries == []
