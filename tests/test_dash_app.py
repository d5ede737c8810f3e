"""`mlx dash` against a real server (tiny test model), driven with Textual's Pilot."""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import pytest
from rich.text import Text
from textual.pilot import Pilot
from textual.widgets import DataTable, Static, TabbedContent

from mlxlaunch.cli.dash import server_locator
from mlxlaunch.dash.app import NO_SERVER, DashApp
from mlxlaunch.dash.feed import ServerAddress
from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.launch.state import RunState, write_state
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import ServerHandle, start_server

TOKEN = "dash-token"
SIZE = (110, 36)


@dataclass
class Served:
    engine: Engine
    server: ServerHandle

    @property
    def address(self) -> ServerAddress:
        return ServerAddress(self.server.url, TOKEN)

    def ask(self, max_tokens: int) -> anthropic.types.Message:
        client = anthropic.Anthropic(base_url=self.server.url, api_key=TOKEN, max_retries=0)
        return client.messages.create(
            model="claude-sonnet-test",
            max_tokens=max_tokens,
            messages=[{"role": "user", "content": "hi"}],
        )

    def stop(self) -> None:
        started = time.monotonic()
        self.server.stop()  # ends the dashboard's stats stream itself instead of waiting on it
        assert time.monotonic() - started < 3


@pytest.fixture
def served(tiny_model_dir: Path) -> Iterator[Served]:
    engine = Engine(EngineConfig(model=str(tiny_model_dir)))
    engine.start()
    server = start_server(engine, ServerSettings(auth_token=TOKEN))
    try:
        yield Served(engine, server)
    finally:
        if server.running:
            server.stop(timeout=2)
        engine.close()


async def until(pilot: Pilot[None], condition: Callable[[], bool], timeout: float = 8.0) -> None:
    """Let the app run until `condition` holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the dashboard did not get there in time"
        await pilot.pause(0.05)


def text_of(app: DashApp, selector: str) -> str:
    """The plain text a Static shows (markup stripped)."""
    return Text.from_markup(str(app.query_one(selector, Static).content)).plain


def table(app: DashApp) -> DataTable[str]:
    return app.query_one("#requests", DataTable)


@pytest.mark.slow
async def test_panels_show_the_requests_the_test_made(served: Served) -> None:
    app = DashApp(lambda: served.address, retry_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connection == "live")
        messages = [await asyncio.to_thread(served.ask, n) for n in (2, 3, 4)]
        await until(pilot, lambda: table(app).row_count == 3)

        for message in messages:
            cells = table(app).get_row(message.id)
            prompt = message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
            assert cells[3] == f"{prompt:,}"
            assert cells[4] == f"{message.usage.cache_read_input_tokens or 0:,}"
            assert cells[5] == str(message.usage.output_tokens)
            assert cells[2] == "claude-sonnet-test"
        # Newest first.
        assert app.visible_requests == [m.id for m in reversed(messages)]
        assert re.search(r"completed\s+3\n", text_of(app, "#requests-card"))
        assert "loaded" in text_of(app, "#model-card")
        output = sum(m.usage.output_tokens for m in messages)
        assert app.latest is not None and app.latest.counters.generated_tokens == output
        assert "● live" in text_of(app, "#status") and served.server.url in text_of(app, "#status")


@pytest.mark.slow
async def test_keys_pause_clear_switch_and_quit(served: Served) -> None:
    app = DashApp(lambda: served.address, retry_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connection == "live")
        first = await asyncio.to_thread(served.ask, 2)
        await until(pilot, lambda: table(app).row_count == 1)

        await pilot.press("p")
        assert "PAUSED" in text_of(app, "#status")
        second = await asyncio.to_thread(served.ask, 2)
        # The feed keeps reading while paused; the table stays as it was.
        await until(pilot, lambda: app.latest is not None and len(app.latest.recent) == 2)
        assert app.visible_requests == [first.id]
        await pilot.press("p")
        assert "PAUSED" not in text_of(app, "#status")
        assert app.visible_requests == [second.id, first.id]

        await pilot.press("c")
        assert table(app).row_count == 0 and len(app.prefill_history) == 0
        third = await asyncio.to_thread(served.ask, 2)
        await until(pilot, lambda: app.visible_requests == [third.id])

        tabs = app.query_one(TabbedContent)
        await pilot.press("2")
        assert tabs.active == "sessions"
        await pilot.press("3")
        assert tabs.active == "miss"
        assert "No cache miss" in text_of(app, "#miss-view")
        await pilot.press("tab")
        assert tabs.active == "overview"
        await pilot.press("1")
        assert tabs.active == "overview"

        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running


@pytest.mark.slow
async def test_server_gone_is_shown_and_retried(served: Served) -> None:
    app = DashApp(lambda: served.address, retry_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connection == "live")
        await asyncio.to_thread(served.stop)
        await until(pilot, lambda: app.connection == "gone")
        status = app.query_one("#status", Static)
        assert status.has_class("gone")
        assert "disconnected" in text_of(app, "#status")
        attempts = app.attempts
        await until(pilot, lambda: app.attempts >= attempts + 2)  # it keeps trying
        assert "not running" in app.gone_reason
        assert app.is_running


async def test_no_server_found_says_how_to_start_one(tmp_path: Path) -> None:
    app = DashApp(server_locator(None, None, home=tmp_path), retry_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connection == "gone")
        assert app.gone_reason == NO_SERVER
        assert "mlx launch claude" in text_of(app, "#status")


@pytest.mark.slow
async def test_finds_the_server_through_its_state_file(served: Served, tmp_path: Path) -> None:
    write_state(
        RunState(
            pid=os.getpid(),
            url=served.server.url,
            token=TOKEN,
            model="tiny",
            model_path="",
            log_file="",
            kind="serve",
        ),
        home=tmp_path,
    )
    locate = server_locator(None, None, home=tmp_path)
    assert locate() == served.address
    # --url without --token takes the token from the matching state file.
    assert server_locator(served.server.url + "/", None, home=tmp_path)() == served.address
    app = DashApp(locate, retry_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connection == "live")
        assert app.address == served.address and app.latest is not None


@pytest.mark.slow
async def test_a_wrong_token_is_reported(served: Served) -> None:
    app = DashApp(lambda: ServerAddress(served.server.url, "wrong"), retry_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connection == "gone")
        assert "token" in app.gone_reason
