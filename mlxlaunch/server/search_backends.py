"""Web search backends: one query in, its results out, over httpx.

`SearchBackend.search()` asks a SearXNG instance (`GET /search?q=…&format=json`) or Brave's
Search API (`GET /res/v1/web/search?q=…` with `X-Subscription-Token`) and returns
`SearchResult`s; every failure is a `SearchFailed` carrying one of the web search tool's
error codes, so the API layers answer it as the tool's error result, never as an HTTP error.

The backend comes from the user's settings (`mlx config set search.backend …`, see
`configured_backend`); none is configured by default, and then nothing is ever sent anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from mlxlaunch.config import SEARCH_API_KEY_ENV, UserConfig
from mlxlaunch.errors import ConfigError
from mlxlaunch.protocol.responses import WebSearchErrorCode

BackendKind = Literal["searxng", "brave"]
BRAVE_URL = "https://api.search.brave.com"
BRAVE_PATH = "/res/v1/web/search"
# Far above what a model writes; the API's own `query_too_long` bound.
MAX_QUERY_CHARS = 400
MAX_RESULTS = 10


@dataclass(frozen=True)
class SearchResult:
    """One hit: where it is, what it is called, the backend's snippet of it, and its age."""

    url: str
    title: str
    snippet: str = ""
    page_age: str | None = None


class SearchFailed(Exception):
    """A search that gave no results: `code` is the tool's error code, `reason` the log's."""

    def __init__(self, code: WebSearchErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.code: WebSearchErrorCode = code
        self.reason = reason


@dataclass(frozen=True)
class SearchBackend:
    """A configured search service.

    Args:
        kind: which API it speaks.
        url: its base URL (Brave: `BRAVE_URL` unless the user points elsewhere).
        api_key: Brave's subscription token (SearXNG needs none).
        timeout_s: the longest one search may take before it is `unavailable`.
    """

    kind: BackendKind
    url: str
    api_key: str | None = None
    timeout_s: float = 10.0

    def describe(self) -> str:
        return f"{self.kind} at {self.url}"

    async def search(self, query: str) -> list[SearchResult]:
        """The results for `query`, at most MAX_RESULTS.

        Raises:
            SearchFailed: an empty or too long query, or a backend that failed, timed out or
                refused (429: `too_many_requests`).
        """
        query = query.strip()
        if not query:
            raise SearchFailed("invalid_tool_input", "empty query")
        if len(query) > MAX_QUERY_CHARS:
            raise SearchFailed("query_too_long", f"query of {len(query)} characters")
        if self.kind == "searxng":
            path, params, headers = "/search", {"q": query, "format": "json"}, {}
        else:
            path, params = BRAVE_PATH, {"q": query, "count": str(MAX_RESULTS)}
            headers = {"X-Subscription-Token": self.api_key or "", "Accept": "application/json"}
        body = await self._get(path, params, headers)
        read = _searxng_results if self.kind == "searxng" else _brave_results
        try:
            return read(body)[:MAX_RESULTS]
        except (KeyError, TypeError, AttributeError) as exc:
            raise SearchFailed("unavailable", f"{self.describe()}: unexpected answer") from exc

    async def _get(self, path: str, params: dict[str, str], headers: dict[str, str]) -> Any:
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                answer = await client.get(self.url + path, params=params, headers=headers)
        except httpx.TimeoutException as exc:
            raise SearchFailed("unavailable", f"{self.describe()}: timed out") from exc
        except httpx.HTTPError as exc:
            raise SearchFailed("unavailable", f"{self.describe()}: {exc}") from exc
        if answer.status_code == 429:
            raise SearchFailed("too_many_requests", f"{self.describe()}: 429")
        if answer.status_code != 200:
            raise SearchFailed("unavailable", f"{self.describe()}: HTTP {answer.status_code}")
        try:
            return answer.json()
        except ValueError as exc:
            raise SearchFailed("unavailable", f"{self.describe()}: not JSON") from exc


def _searxng_results(body: Any) -> list[SearchResult]:
    return [
        SearchResult(
            url=str(hit["url"]),
            title=str(hit.get("title") or hit["url"]),
            snippet=str(hit.get("content") or ""),
            page_age=hit.get("publishedDate") or None,
        )
        for hit in body["results"]
        if hit.get("url")
    ]


def _brave_results(body: Any) -> list[SearchResult]:
    web = body.get("web") or {}
    return [
        SearchResult(
            url=str(hit["url"]),
            title=str(hit.get("title") or hit["url"]),
            snippet=str(hit.get("description") or ""),
            page_age=hit.get("page_age") or hit.get("age") or None,
        )
        for hit in web.get("results") or []
        if hit.get("url")
    ]


def configured_backend(
    config: UserConfig, env: Mapping[str, str] | None = None
) -> SearchBackend | None:
    """The backend the user's settings name (None: web search is not configured).

    Raises:
        ConfigError: a backend without what it needs (SearXNG's URL, Brave's key).
    """
    env = os.environ if env is None else env
    kind = config.get("search.backend")
    if kind is None:
        return None
    url = config.get("search.url")
    key = config.get("search.api-key") or env.get(SEARCH_API_KEY_ENV) or None
    if kind == "searxng":
        if not url:
            raise ConfigError(
                "search.backend is searxng but search.url is not set",
                hint="mlx config set search.url http://HOST:PORT (your SearXNG instance)",
            )
        return SearchBackend("searxng", url)
    if not key:
        raise ConfigError(
            "search.backend is brave but it has no API key",
            hint=f"mlx config set search.api-key KEY, or set ${SEARCH_API_KEY_ENV}",
        )
    return SearchBackend("brave", url or BRAVE_URL, api_key=key)
