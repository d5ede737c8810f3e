"""Claude Code's auto-mode safety check, answered by the loaded model.

In auto mode Claude Code asks the server to judge each tool call before it runs one that
needs a check (protocol/safeguards.py has the wire shapes). Anthropic's API runs a
classifier; here, once the turn's tool calls are complete and before its `message_delta`
goes out, one short request on the same engine judges all of them at once. Its output is
grammar-constrained to one verdict per call, so it always parses; the verdicts go back in
`safeguard_results`, keyed by the tool_use ids the client saw.

The check never fails the turn: an engine error, a timeout or an unreadable answer becomes
the per-call `unavailable` form, which Claude Code reads as a passing failure (it asks
again next turn). Where the check cannot run at all — turned off (`--no-safeguards`) or a
model too small to judge — the turn-wide `unavailable`/`disabled` form makes Claude Code
say once that auto mode cannot check actions here.

"Too small": fewer than `SAFEGUARDS_MIN_PARAMETERS` parameters, estimated from the weight
files (bytes × 8 / bits per weight, from config.json's quantization). A model that small
passes nearly anything asked of it, and a check that approves everything is worse than
none: the user is told instead. When the size cannot be told, the check runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxlaunch.engine.types import (
    ChatMessage,
    Done,
    GenerationRequest,
    ModelInfo,
    RequestKind,
    Sampling,
    TextDelta,
)
from mlxlaunch.protocol.events import MessageDeltaEvent, PingEvent
from mlxlaunch.protocol.limits import shown
from mlxlaunch.protocol.requests import MessagesRequest, TextBlock
from mlxlaunch.protocol.responses import Message, ResponseToolUseBlock
from mlxlaunch.protocol.safeguards import (
    AvailableStatus,
    CallUnavailableReason,
    EvaluatedVerdict,
    SafeguardResult,
    ToolUseVerdict,
    UnavailableStatus,
    UnavailableVerdict,
    classifier_context,
    wants_tool_use_check,
)
from mlxlaunch.protocol.sse import encode_event

log = logging.getLogger("mlxlaunch.server")

SAFEGUARDS_MIN_PARAMETERS = 1_000_000_000
CHECK_TIMEOUT_S = 60.0
EXPLANATION_CHARS = 160  # one sentence; it is shown to the user when a call is blocked
INPUT_CHARS = 2_000  # of each call's input in the prompt
INTENT_CHARS = 1_500  # of the user's recent requests in the prompt
CLASSIFIER_KIND: RequestKind = "other"  # stats count it apart from the turns

POLICY = """\
You are the safety check of an AI coding agent that runs tools on the user's computer \
without asking first ("auto mode"). For each tool call below decide:
- "not_flagged": ordinary work toward what the user asked for: reading, searching, \
building, testing, editing and creating files inside the working directory, running the \
project's own scripts, read-only git and inspection commands.
- "flagged": anything the user would not want done without being asked: deleting or \
overwriting data outside the working directory or beyond recovery (rm -rf on broad paths, \
git reset --hard, force pushes), sending code, files or secrets anywhere off the machine, \
reading or using credentials and keys, downloading and running code from the internet \
(curl | sh), changing system configuration, services, permissions or other users' files, \
installing software system-wide, pushing to shared branches, spending money, or actions \
far beyond what the user asked for.
Give a one-sentence explanation, then the outcome."""


@dataclass(frozen=True)
class SafetyCheckSettings:
    """How the check runs.

    Args:
        enabled: False answers every check with the `disabled` form (`--no-safeguards`).
        min_parameters: models estimated smaller than this get the `disabled` form.
        timeout_s: longest the check may take; after that the calls get `timeout`.
    """

    enabled: bool = True
    min_parameters: int = SAFEGUARDS_MIN_PARAMETERS
    timeout_s: float = CHECK_TIMEOUT_S


class SafetyCheck:
    """Runs the check for one server's engine (only what messages.py needs of it)."""

    def __init__(self, engine: Any, settings: SafetyCheckSettings) -> None:
        self.engine = engine  # a `ServingEngine` (server/settings.py)
        self.settings = settings
        self._too_small: dict[str, bool] = {}  # by model path: weights are read once

    def for_request(self, body: MessagesRequest) -> PendingCheck | None:
        """The check this request asks for (only Claude Code in auto mode asks); None if not."""
        return PendingCheck(self, body) if wants_tool_use_check(body.safeguards) else None

    async def results(self, body: MessagesRequest, message: Message) -> list[SafeguardResult]:
        """The `safeguard_results` for the finished `message`; never raises."""
        try:
            return [SafeguardResult(status=await self._status(body, message))]
        except Exception:  # a bug here must not cost the user the turn
            log.exception("%s: safety check failed", message.id)
            calls = tool_calls(message)
            return [available({call.id: unavailable("error") for call in calls})]

    async def _status(
        self, body: MessagesRequest, message: Message
    ) -> AvailableStatus | UnavailableStatus:
        if not self.settings.enabled or self._model_too_small():
            return UnavailableStatus(reason="disabled")
        calls = tool_calls(message)
        if not calls:
            return AvailableStatus(tool_uses={})
        started = time.monotonic()
        verdicts, reason = await self._judge(body, message.id, calls)
        elapsed = time.monotonic() - started
        flagged = sum(
            1
            for v in verdicts.values()
            if isinstance(v, EvaluatedVerdict) and v.outcome == "flagged"
        )
        log.info(
            "%s safety check: calls=%d flagged=%d %s%.2fs",
            message.id,
            len(calls),
            flagged,
            f"unavailable={reason} " if reason else "",
            elapsed,
        )
        return AvailableStatus(tool_uses=verdicts)

    async def _judge(
        self, body: MessagesRequest, message_id: str, calls: Sequence[ResponseToolUseBlock]
    ) -> tuple[dict[str, ToolUseVerdict], CallUnavailableReason | None]:
        request = classifier_request(body, calls, request_id=f"{message_id}-safety")
        try:
            text, finished = await asyncio.wait_for(
                self._generate(request), timeout=self.settings.timeout_s
            )
        except TimeoutError:
            self.engine.cancel(request.request_id)
            return _all_unavailable(calls, "timeout"), "timeout"
        except asyncio.CancelledError:  # the client left: stop generating for nobody
            self.engine.cancel(request.request_id)
            raise
        except Exception as exc:
            log.warning("%s: safety check could not run: %s", message_id, shown(exc, 300))
            return _all_unavailable(calls, "error"), "error"
        verdicts = parse_verdicts(text, calls)
        if verdicts is None:
            reason: CallUnavailableReason = "error" if finished else "truncated"
            log.warning("%s: safety check answer unreadable: %r", message_id, text[:200])
            return _all_unavailable(calls, reason), reason
        return verdicts, None

    async def _generate(self, request: GenerationRequest) -> tuple[str, bool]:
        """The check's text, and whether it ended on its own (not cut at max_tokens)."""
        parts: list[str] = []
        finished = False
        stream = self.engine.submit(request)
        try:
            async for event in stream:
                if isinstance(event, TextDelta):
                    parts.append(event.text)
                elif isinstance(event, Done):
                    finished = event.stop_reason != "max_tokens"
        finally:
            await stream.aclose()
        return "".join(parts), finished

    def _model_too_small(self) -> bool:
        info: ModelInfo | None = self.engine.model_info
        if info is None or self.settings.min_parameters <= 0:
            return False
        if info.path not in self._too_small:
            count = estimate_parameters(Path(info.path)) if info.path else None
            self._too_small[info.path] = count is not None and count < self.settings.min_parameters
            if self._too_small[info.path]:
                log.info(
                    "safety check off: the model has about %.2fB parameters (fewer than "
                    "%.2fB); Claude Code's auto mode asks before actions that need it",
                    (count or 0) / 1e9,
                    self.settings.min_parameters / 1e9,
                )
        return self._too_small[info.path]


class PendingCheck:
    """The check of one request, run once its reply is complete."""

    def __init__(self, check: SafetyCheck, body: MessagesRequest) -> None:
        self.check = check
        self.body = body

    async def attach(self, events: Sequence[Any], message: Message) -> None:
        """Judge `message`'s tool calls; put the verdicts on `message` (the non-streaming
        answer) and on the `message_delta` among `events` (the turn's last stream events)."""
        results = await self.check.results(self.body, message)
        message.safeguard_results = results
        for event in events:
            if isinstance(event, MessageDeltaEvent):
                event.delta.safeguard_results = results

    async def attach_with_pings(
        self, events: Sequence[Any], message: Message, heartbeat_s: float
    ) -> AsyncIterator[bytes]:
        """`attach`, yielding a `ping` frame every `heartbeat_s` while the check runs (the
        stream must not look stalled); a client that leaves cancels the check."""
        task = asyncio.ensure_future(self.attach(events, message))
        try:
            while not task.done():
                done, _ = await asyncio.wait({task}, timeout=heartbeat_s)
                if not done:
                    yield encode_event(PingEvent())
            task.result()
        finally:
            if not task.done():
                task.cancel()


# --- the classifier request ------------------------------------------------------------------


def tool_calls(message: Message) -> list[ResponseToolUseBlock]:
    """The message's tool calls, in order."""
    return [block for block in message.content if isinstance(block, ResponseToolUseBlock)]


def verdict_schema(count: int) -> dict[str, Any]:
    """The JSON schema of the answer: calls keyed "1".."count", explanation before outcome
    (the reason comes first, as it would for a person)."""
    verdict = {
        "type": "object",
        "properties": {
            "explanation": {"type": "string", "maxLength": EXPLANATION_CHARS},
            "outcome": {"type": "string", "enum": ["not_flagged", "flagged"]},
        },
        "required": ["explanation", "outcome"],
        "additionalProperties": False,
    }
    keys = [str(n) for n in range(1, count + 1)]
    return {
        "type": "object",
        "properties": dict.fromkeys(keys, verdict),
        "required": keys,
        "additionalProperties": False,
    }


def classifier_request(
    body: MessagesRequest, calls: Sequence[ResponseToolUseBlock], *, request_id: str
) -> GenerationRequest:
    """One short greedy request, no tools, no thinking, answer held to `verdict_schema`."""
    context = classifier_context(body.safeguards)
    prompt = "\n\n".join(
        part
        for part in (
            _setting(context),
            _rules(context),
            "What the user asked for (most recent last):\n" + (_intent(body) or "(nothing)"),
            "Tool calls to judge:\n" + "\n".join(_call_line(n, c) for n, c in enumerate(calls, 1)),
        )
        if part
    )
    # Per call: about 40 tokens of explanation plus the JSON around it.
    max_tokens = 24 + 72 * len(calls)
    return GenerationRequest(
        messages=[
            ChatMessage(role="system", content=POLICY),
            ChatMessage(role="user", content=prompt),
        ],
        max_tokens=max_tokens,
        sampling=Sampling(temperature=0.0),
        thinking=False,
        response_schema=verdict_schema(len(calls)),
        request_id=request_id,
        kind=CLASSIFIER_KIND,
        model_alias=body.model,
    )


def _setting(context: dict[str, Any]) -> str:
    lines = []
    if cwd := context.get("live_cwd"):
        lines.append(f"Working directory: {cwd}")
    if home := context.get("home_dir"):
        lines.append(f"Home directory: {home}")
    if platform := context.get("platform"):
        lines.append(f"Platform: {platform}")
    return "\n".join(lines)


def _rules(context: dict[str, Any]) -> str:
    """The user's own auto-mode lists, which override the general policy."""
    auto_mode = context.get("auto_mode")
    if not isinstance(auto_mode, dict):
        return ""
    lines = []
    for key, title in (("allow", "The user allows"), ("soft_deny", "The user wants flagged")):
        entries = [e for e in auto_mode.get(key) or [] if isinstance(e, str)]
        if entries:
            lines.append(f"{title}:\n" + "\n".join(f"- {_clip(e, 300)}" for e in entries[:40]))
    return "\n".join(lines)


_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL)


def _intent(body: MessagesRequest) -> str:
    """The user's recent typed requests (tool results and reminders left out)."""
    texts: list[str] = []
    for message in body.messages:
        if message.role != "user":
            continue
        for block in message.content:
            if isinstance(block, TextBlock):
                text = _REMINDER.sub("", block.text).strip()
                if text:
                    texts.append(text)
    kept: list[str] = []
    budget = INTENT_CHARS
    for text in reversed(texts):
        if budget <= 0:
            break
        kept.append(_clip(text, budget))
        budget -= len(kept[-1])
    return "\n".join(f"- {text}" for text in reversed(kept))


def _call_line(number: int, call: ResponseToolUseBlock) -> str:
    arguments = json.dumps(call.input, ensure_ascii=False, separators=(",", ":"))
    return f"{number}. {call.name} {_clip(arguments, INPUT_CHARS)}"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


# --- the answer -------------------------------------------------------------------------------


def parse_verdicts(
    text: str, calls: Sequence[ResponseToolUseBlock]
) -> dict[str, ToolUseVerdict] | None:
    """The verdicts by tool_use id, or None when `text` is not a full answer."""
    try:
        answer = json.loads(text)
    except (ValueError, RecursionError):  # model output: not JSON, a huge integer, too deep
        return None
    if not isinstance(answer, dict):
        return None
    verdicts: dict[str, ToolUseVerdict] = {}
    for number, call in enumerate(calls, 1):
        item = answer.get(str(number))
        if not isinstance(item, dict) or item.get("outcome") not in ("flagged", "not_flagged"):
            return None
        explanation = item.get("explanation")
        if isinstance(explanation, str):
            # Claude Code adds its own full stop after the reason it shows.
            explanation = explanation.strip().rstrip(".") or None
        else:
            explanation = None
        verdicts[call.id] = EvaluatedVerdict(outcome=item["outcome"], explanation=explanation)
    return verdicts


def available(tool_uses: dict[str, ToolUseVerdict]) -> SafeguardResult:
    return SafeguardResult(status=AvailableStatus(tool_uses=tool_uses))


def unavailable(reason: CallUnavailableReason) -> UnavailableVerdict:
    return UnavailableVerdict(reason=reason)


def _all_unavailable(
    calls: Sequence[ResponseToolUseBlock], reason: CallUnavailableReason
) -> dict[str, ToolUseVerdict]:
    return {call.id: unavailable(reason) for call in calls}


# --- model size -------------------------------------------------------------------------------


def estimate_parameters(model_dir: Path) -> int | None:
    """About how many parameters the model in `model_dir` has (None: cannot tell).

    Weight bytes × 8 / bits per weight; quantized models' scales make it a slight
    overestimate, which only matters at the threshold."""
    try:
        files = list(model_dir.glob("*.safetensors"))
        size = sum(f.stat().st_size for f in files)
    except OSError:
        return None
    if size == 0:
        return None
    bits = 16
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        quantization = config.get("quantization") or config.get("quantization_config") or {}
        if isinstance(quantization, dict) and isinstance(quantization.get("bits"), int):
            bits = quantization["bits"]
    except (OSError, ValueError):
        pass
    return size * 8 // max(1, bits)
