"""One log line per request and one per refusal, the same for all three APIs, with what a
client chose (a type, a name, an id) bounded before it reaches a line.

`RequestLog` collects a request's figures and logs them once (`finish`); `log_refusal` is
the line of a request refused with a client error (4xx), whichever API and wherever it was
refused. What a client chose is shortened with `protocol.limits.shown` (one request's 22 MB
`type` was logged whole); the log formatter (launch/server_log.py) is the backstop.
"""

from __future__ import annotations

import logging
import time

from starlette.requests import Request

from mlxlaunch.engine.types import (
    Admitted,
    Done,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolCallStart,
)
from mlxlaunch.protocol.limits import shown
from mlxlaunch.server.errors import ApiError
from mlxlaunch.server.web_search import ServedEvent

log = logging.getLogger("mlxlaunch.server")

OUTPUT_EVENTS = (TextDelta, ThinkingDelta, ToolCallStart, ToolCallEvent)
REFUSAL_CHARS = 200  # of a refusal's message


def log_refusal(request: Request, error: ApiError) -> None:
    """The one line of a request refused with a client error (a 5xx is logged where it
    happened, with its cause)."""
    if error.status >= 500:
        return
    log.info(
        "%s %s refused: status=%d %s",
        request.method, shown(request.url.path), error.status, shown(error.message, REFUSAL_CHARS),
    )  # fmt: skip


class RequestLog:
    """Collects one request's figures and logs them as one line (never the auth token)."""

    def __init__(self, request_id: str, model: str, started: float) -> None:
        self.request_id = request_id
        self.model = model
        self.started = started
        self.done: Done | None = None
        self.admitted: Admitted | None = None  # the prompt's figures, if no Done comes
        self.first_output: float | None = None
        self.outputs = 0  # output events sent (what a stream cut short had, with no Done)
        self._logged = False

    def observe(self, event: ServedEvent) -> None:
        if isinstance(event, Admitted):
            self.admitted = event
        elif isinstance(event, Done):
            self.done = event
        elif isinstance(event, OUTPUT_EVENTS):
            self.outputs += 1
            if self.first_output is None:
                self.first_output = time.monotonic()

    def finish(self, status: int) -> None:
        if self._logged:
            return
        self._logged = True
        usage = self.done.usage if self.done else None
        timings = self.done.timings if self.done else None
        ttft = timings.ttft_s if timings and timings.ttft_s else self._ttft()
        # A request cut short (cancelled, failed) has no Done: its admission has the prompt.
        admitted = self.admitted
        prompt = usage.prompt_tokens if usage else (admitted.prompt_tokens if admitted else 0)
        cached = usage.cached_tokens if usage else (admitted.cached_tokens if admitted else 0)
        # Cut short (a cancel, a shutdown): no Done, but what was sent still counts.
        output = usage.output_tokens if usage else self.outputs
        # Which model served it, where the server serves several (its id may name another).
        served = f" served={shown(admitted.served_by)}" if admitted and admitted.served_by else ""
        log.info(
            "%s model=%s prompt=%d cached=%d output=%d ttft=%.2fs tok/s=%.1f draft=%d/%d "
            "status=%d%s",
            self.request_id,
            shown(self.model),
            prompt,
            cached,
            output,
            ttft,
            timings.decode_tps if timings else 0.0,
            timings.accepted_tokens if timings else 0,
            timings.drafted_tokens if timings else 0,
            status,
            served,
        )

    def _ttft(self) -> float:
        return (self.first_output - self.started) if self.first_output is not None else 0.0
