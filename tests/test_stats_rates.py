"""Prefill and decode speeds cover a recent window by the engine's clock: an idle server reads 0.

The bookkeeping alone with a fake clock, then a real server and `mlx dash` (Pilot) on the tiny
model whose engine runs on that fake clock: `/v1/stats`, `/metrics` and the dashboard's titles
all fall to 0 once the clock passes the window, without another request.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest
from engine_helpers import FakeClock, serve
from rich.text import Text
from textual.widgets import Static

from mlxlaunch.dash.app import DashApp
from mlxlaunch.dash.feed import ServerAddress
from mlxlaunch.engine.stats import RATE_WINDOW_S, StatsBook
from mlxlaunch.server.runner import ServerHandle

TOKEN = "rates-token"
WAIT_S = 30.0  # a hang, not a measurement


def test_speeds_hold_within_the_window_and_read_zero_after_it() -> None:
    clock = FakeClock()
    book = StatsBook(clock)
    book.step(prompt_tokens=3280, prompt_s=1.0, gen_tokens=0, decode_s=0.0)
    clock.advance(1)
    book.step(prompt_tokens=0, prompt_s=0.0, gen_tokens=229, decode_s=1.0)
    snap = book.snapshot()
    assert (snap.prefill_tps, snap.decode_tps) == (3280.0, 229.0)

    clock.advance(RATE_WINDOW_S - 2)  # the prefill step is still inside the window
    assert book.snapshot().prefill_tps == 3280.0
    clock.advance(1.5)  # past the prefill step, not yet past the decode step
    snap = book.snapshot()
    assert (snap.prefill_tps, snap.decode_tps) == (0.0, 229.0)
    clock.advance(50)
    snap = book.snapshot()
    assert (snap.prefill_tps, snap.decode_tps) == (0.0, 0.0)
    # Admission's backlog estimate keeps the machine's last measured prefill speed.
    assert book.prefill_tps() == 3280.0


def test_the_window_is_a_parameter() -> None:
    clock = FakeClock()
    book = StatsBook(clock, rate_window_s=2.0)
    book.step(prompt_tokens=100, prompt_s=0.5, gen_tokens=10, decode_s=0.5)
    clock.advance(1.9)
    assert book.snapshot().decode_tps == 20.0
    clock.advance(0.2)
    assert book.snapshot().decode_tps == 0.0


# --- the server, its metrics and the dashboard read the same decayed figures ------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def server(tiny_model_dir: Path, clock: FakeClock) -> Iterator[ServerHandle]:
    config = {"clock": clock, "idle_clear_s": None}
    with serve(tiny_model_dir, token=TOKEN, scripted=False, **config) as served:
        yield served.server


def _stats(server: ServerHandle) -> dict[str, float]:
    data = httpx.get(server.url + "/v1/stats", headers={"x-api-key": TOKEN}, timeout=10).json()
    return {"prefill": data["prefill_tps"], "decode": data["decode_tps"]}


def _metric(server: ServerHandle, name: str) -> float:
    text = httpx.get(server.url + "/metrics", headers={"x-api-key": TOKEN}, timeout=10).text
    match = re.search(rf"^mlxlaunch_{name} (\S+)$", text, re.MULTILINE)
    assert match, f"no {name} in /metrics"
    return float(match.group(1))


def _title(app: DashApp, selector: str) -> str:
    return Text.from_markup(str(app.query_one(selector, Static).content)).plain


def _shown_rate(app: DashApp, selector: str) -> float:
    match = re.search(r"([\d,.]+) tok/s", _title(app, selector))
    assert match, _title(app, selector)
    return float(match.group(1).replace(",", ""))


@pytest.mark.slow
async def test_idle_server_reads_zero_everywhere(server: ServerHandle, clock: FakeClock) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key=TOKEN, max_retries=0)

    def ask() -> None:
        client.messages.create(
            model="claude-x", max_tokens=24, messages=[{"role": "user", "content": "hello there"}]
        )

    await asyncio.to_thread(ask)
    app = DashApp(lambda: ServerAddress(server.url, TOKEN), retry_s=0.2)
    async with app.run_test(size=(110, 36)) as pilot:
        deadline = time.monotonic() + WAIT_S
        # The worker closes its last measuring window once it is idle.
        while _shown_rate(app, "#decode-title") == 0 or _shown_rate(app, "#prefill-title") == 0:
            assert time.monotonic() < deadline, "the dashboard never showed a speed"
            await pilot.pause(0.05)
        rates = await asyncio.to_thread(_stats, server)
        assert rates["prefill"] > 0 and rates["decode"] > 0
        assert await asyncio.to_thread(_metric, server, "decode_tokens_per_second") > 0

        clock.advance(RATE_WINDOW_S + 1)  # nothing ran since

        assert await asyncio.to_thread(_stats, server) == {"prefill": 0.0, "decode": 0.0}
        for name in ("prefill_tokens_per_second", "decode_tokens_per_second"):
            assert await asyncio.to_thread(_metric, server, name) == 0.0
        deadline = time.monotonic() + WAIT_S
        while _shown_rate(app, "#decode-title") or _shown_rate(app, "#prefill-title"):
            assert time.monotonic() < deadline, "the dashboard kept showing stale speeds"
            await pilot.pause(0.05)
        assert "(peak" in _title(app, "#decode-title")  # the history still shows what ran
