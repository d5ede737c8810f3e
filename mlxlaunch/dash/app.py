"""`mlx dash`: a Textual app that follows a running server's stats stream.

Data flows one way: a feed (HTTP, in an async worker on the app's own loop) hands snapshots to
`show()`, which updates the widgets. `show()` is also how tests and snapshot tests feed
recorded stats without a server. When the server is missing or goes away, the status line says
so and the worker keeps looking (the locate callback runs again on every attempt, so a server
started later is found).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import ClassVar, Literal

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Footer, Sparkline, Static, TabbedContent, TabPane

from mlxlaunch.dash import RETRY_S
from mlxlaunch.dash.feed import ServerAddress, ServerUnreachable, StatsFeed
from mlxlaunch.dash.panels import (
    REQUEST_COLUMNS,
    SESSION_COLUMNS,
    cache_card,
    miss_text,
    model_card,
    rate_title,
    request_cells,
    requests_card,
    session_cells,
)
from mlxlaunch.protocol.stats import CacheMiss, StatsSnapshot

Connection = Literal["looking", "live", "gone"]
Locate = Callable[[], ServerAddress | None]
FeedFactory = Callable[[ServerAddress], StatsFeed]

# Points kept for the sparklines: at one snapshot a second, the last five minutes.
HISTORY_POINTS = 300
PANELS = ("overview", "sessions", "miss")

NO_SERVER = "no running server found; start one with `mlx launch claude` or `mlx serve`"


# The cards row's height in dash.tcss: six lines and the border.
CARDS_HEIGHT = 8


class DashApp(App[None]):
    """Live view of one mlxlaunch server.

    Args:
        locate: finds the server to watch (None: none running yet); called on every attempt.
            None: no feed at all; the app shows only what `show()` is given (tests).
        feed_factory: builds the feed for an address (test seam).
        retry_s: pause between attempts to reach the server.
    """

    TITLE = "mlx dash"
    CSS_PATH = "dash.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("p", "toggle_pause", "Pause"),
        Binding("c", "clear", "Clear"),
        Binding("tab", "next_panel", "Next panel", priority=True),
        Binding("1", "panel('overview')", "Overview"),
        Binding("2", "panel('sessions')", "Sessions"),
        Binding("3", "panel('miss')", "Cache miss"),
    ]

    def __init__(
        self,
        locate: Locate | None = None,
        *,
        feed_factory: FeedFactory = StatsFeed,
        retry_s: float = RETRY_S,
    ) -> None:
        super().__init__()
        self.locate = locate
        self.feed_factory = feed_factory
        self.retry_s = retry_s
        self.latest: StatsSnapshot | None = None
        self.paused = False
        self.connection: Connection = "looking"
        self.gone_reason = ""
        self.attempts = 0
        self.address: ServerAddress | None = None
        self.prefill_history: deque[float] = deque(maxlen=HISTORY_POINTS)
        self.decode_history: deque[float] = deque(maxlen=HISTORY_POINTS)
        self._hidden_requests: set[str] = set()
        self._hidden_miss: CacheMiss | None = None
        self._shown_rows: tuple[str, ...] = ()
        self._shown_sessions: list[tuple[str, ...]] = []

    # --- layout -------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static(id="status")
        with TabbedContent(initial="overview"):
            with TabPane("Overview", id="overview"):
                with Horizontal(id="cards"):
                    yield Static(id="requests-card", classes="card")
                    yield Static(id="model-card", classes="card")
                    yield Static(id="cache-card", classes="card")
                with Vertical(id="rates"):
                    yield Static(id="prefill-title", classes="rate-title")
                    yield Sparkline([], id="prefill")
                    yield Static(id="decode-title", classes="rate-title")
                    yield Sparkline([], id="decode")
                yield DataTable(id="requests", cursor_type="row", zebra_stripes=True)
            with TabPane("Sessions", id="sessions"):
                yield DataTable(id="sessions-table", cursor_type="row", zebra_stripes=True)
            with TabPane("Cache miss", id="miss"):
                yield Static(id="miss-view")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#requests-card").border_title = "Requests"
        self.query_one("#model-card").border_title = "Model"
        self.query_one("#cache-card").border_title = "Prefix cache"
        self.query_one("#miss-view").border_title = "Latest cache miss"
        table = self.query_one("#requests", DataTable)
        table.add_columns(*REQUEST_COLUMNS)
        table.border_title = "Recent requests"
        sessions = self.query_one("#sessions-table", DataTable)
        sessions.add_columns(*SESSION_COLUMNS)
        sessions.border_title = "Agent sessions (Claude Code's session id, Codex's cache key)"
        self._render_all()
        if self.locate is not None:
            self.run_worker(self._follow(), name="feed", exclusive=True)

    # --- data in ------------------------------------------------------------------------

    def show(self, snapshot: StatsSnapshot) -> None:
        """Take a new snapshot (from the feed or a test) and update the view."""
        self.latest = snapshot
        self.connection = "live"
        if self.paused:
            self._render_status()
            return
        self.prefill_history.append(snapshot.prefill_tps)
        self.decode_history.append(snapshot.decode_tps)
        self._render_all()

    def show_gone(self, reason: str) -> None:
        """The server is missing or went away; keep the last numbers, say so, keep trying."""
        self.connection = "gone"
        self.gone_reason = reason
        self._render_status()

    async def _follow(self) -> None:
        assert self.locate is not None
        while True:
            self.attempts += 1
            try:
                address = self.locate()
                if address is None:
                    raise ServerUnreachable(NO_SERVER)
                self.address = address
                async for snapshot in self.feed_factory(address).follow():
                    self.attempts = 0
                    self.show(snapshot)
            except ServerUnreachable as exc:
                self.show_gone(exc.reason)
            except Exception as exc:  # a bug or odd reply must not take the dashboard down
                self.show_gone(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(self.retry_s)

    # --- keys ---------------------------------------------------------------------------

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        if not self.paused and self.latest is not None:
            self._render_all()
        self._render_status()

    def action_clear(self) -> None:
        """Empty the sparklines and hide the requests and miss seen so far."""
        self.prefill_history.clear()
        self.decode_history.clear()
        if self.latest is not None:
            self._hidden_requests |= {r.request_id for r in self.latest.recent}
            self._hidden_miss = self.latest.cache.last_miss
        self._render_all()

    def action_panel(self, panel: str) -> None:
        self.query_one(TabbedContent).active = panel

    def action_next_panel(self) -> None:
        tabs = self.query_one(TabbedContent)
        index = PANELS.index(tabs.active) if tabs.active in PANELS else -1
        tabs.active = PANELS[(index + 1) % len(PANELS)]

    # --- rendering ----------------------------------------------------------------------

    @property
    def visible_requests(self) -> list[str]:
        """Ids of the rows in the requests table, newest first."""
        return list(self._shown_rows)

    def _render_all(self) -> None:
        self._render_status()
        s = self.latest or StatsSnapshot()
        self.query_one("#requests-card", Static).update(requests_card(s))
        self.query_one("#model-card", Static).update(model_card(s))
        beside = len(s.models[1:])  # a line each in the model card (dash.tcss: 8 for none)
        if beside:
            self.query_one("#cards").styles.height = CARDS_HEIGHT + beside
        self.query_one("#cache-card", Static).update(cache_card(s))
        prefill, decode = list(self.prefill_history), list(self.decode_history)
        self.query_one("#prefill", Sparkline).data = prefill
        self.query_one("#decode", Sparkline).data = decode
        current_prefill = s.prefill_tps if prefill else 0.0
        current_decode = s.decode_tps if decode else 0.0
        title = rate_title("prefill", current_prefill, prefill)
        self.query_one("#prefill-title", Static).update(title)
        title = rate_title("decode ", current_decode, decode)
        self.query_one("#decode-title", Static).update(title)
        self._render_requests(s)
        self._render_sessions(s)
        miss = s.cache.last_miss if s.cache.last_miss != self._hidden_miss else None
        self.query_one("#miss-view", Static).update(miss_text(miss))

    def _render_requests(self, s: StatsSnapshot) -> None:
        rows = [r for r in reversed(s.recent) if r.request_id not in self._hidden_requests]
        ids = tuple(r.request_id for r in rows)
        if ids == self._shown_rows:
            return
        table = self.query_one("#requests", DataTable)
        table.clear()
        for row in rows:
            table.add_row(*request_cells(row), key=row.request_id)
        self._shown_rows = ids

    def _render_sessions(self, s: StatsSnapshot) -> None:
        rows = [session_cells(session, s.cache.last_miss) for session in s.sessions]
        if rows == self._shown_sessions:
            return
        table = self.query_one("#sessions-table", DataTable)
        table.clear()
        for cells in rows:
            table.add_row(*cells)
        self._shown_sessions = rows

    def _render_status(self) -> None:
        status = self.query_one("#status", Static)
        where = self.address.url if self.address else ""
        if self.locate is None:
            where = "(recorded stats)"
        for name in ("looking", "live", "gone"):
            status.set_class(self.connection == name, name)
        if self.connection == "gone":
            text = (
                f"[b]○ disconnected[/b] {where}  {self.gone_reason}; "
                f"retrying every {self.retry_s:g}s"
            )
        elif self.connection == "looking":
            text = f"[b]… connecting[/b] {where}"
        else:
            text = f"[b]● live[/b] {where}"
        if self.paused:
            text += "   [b reverse] PAUSED [/] press p to resume"
        status.update(text)
