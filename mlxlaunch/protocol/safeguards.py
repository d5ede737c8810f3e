"""Wire types of Claude Code's server-side safety check (`safeguards` / `safeguard_results`).

In auto mode Claude Code 2.1.332 sends the beta header `dangerous-tool-use-2026-09-03` and,
in the body, `"safeguards": [{"type": "dangerous_tool_use", "classifier_context": {...}}]`
(the permission mode, working folders, permission rules, `auto_mode` allow/soft_deny lists,
git state, ...). It expects the verdict for the turn's tool calls in the answer: in the
final `message_delta` of a stream (`delta.safeguard_results`) or at the top level of a
non-streaming message. The shapes below are the bundle's own zod schemas (see
/tmp/helpers/safeguards.md for where they were read):

    safeguard_results: [{"type": "dangerous_tool_use", "status": STATUS}]
    STATUS: {"type": "available", "tool_uses": {TOOL_USE_ID: VERDICT, ...}}
          | {"type": "unavailable", "reason": "disabled" | "error" | "rate_limited" | ...}
          | {"type": "unsupported"}
    VERDICT: {"type": "evaluated", "outcome": "flagged" | "not_flagged", "explanation": str}
           | {"type": "skipped"}
           | {"type": "unavailable", "reason": "timeout" | "error" | "truncated" | ...}

A turn-wide `unavailable` with reason `disabled` makes Claude Code explain once that auto
mode cannot check actions here; a per-call `unavailable` (`error`, `timeout`) reads as a
passing failure of the check, and the next turn asks again.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator

DANGEROUS_TOOL_USE = "dangerous_tool_use"
SAFEGUARDS_BETA = "dangerous-tool-use-2026-09-03"

# The reasons Claude Code tells apart (anything else reads as "other").
StatusUnavailableReason = Literal["disabled", "error", "rate_limited", "input_too_long"]
CallUnavailableReason = Literal[
    "timeout",
    "error",
    "refused",
    "input_too_long",
    "input_unparsed",
    "truncated",
    "not_judged_as_run",
]
Outcome = Literal["flagged", "not_flagged"]


class SafeguardRequest(BaseModel):
    """One entry of the request's `safeguards` list. Its context is Claude Code's to define
    and grows every release: it is read, never validated beyond being an object."""

    model_config = ConfigDict(extra="allow")

    type: str
    classifier_context: dict[str, Any] | None = None


def _readable_entries(value: Any) -> Any:
    """Keep the entries this server can read and drop the rest: the field is Claude Code's
    and may change shape; a request must never be refused for it (unknown fields are
    ignored everywhere, requests.py)."""
    if not isinstance(value, list):
        return None
    entries = [e for e in value if isinstance(e, dict) and isinstance(e.get("type"), str)]
    return [
        e if isinstance(e.get("classifier_context"), dict | None) else {"type": e["type"]}
        for e in entries
    ]


# The request field: a list of entries, or None when absent or unreadable.
Safeguards = Annotated[list[SafeguardRequest] | None, BeforeValidator(_readable_entries)]


class EvaluatedVerdict(BaseModel):
    type: Literal["evaluated"] = "evaluated"
    outcome: Outcome
    explanation: str | None = None


class SkippedVerdict(BaseModel):
    type: Literal["skipped"] = "skipped"


class UnavailableVerdict(BaseModel):
    type: Literal["unavailable"] = "unavailable"
    reason: CallUnavailableReason


ToolUseVerdict = Annotated[
    EvaluatedVerdict | SkippedVerdict | UnavailableVerdict, Discriminator("type")
]


class AvailableStatus(BaseModel):
    type: Literal["available"] = "available"
    tool_uses: dict[str, ToolUseVerdict]


class UnavailableStatus(BaseModel):
    type: Literal["unavailable"] = "unavailable"
    reason: StatusUnavailableReason


class UnsupportedStatus(BaseModel):
    type: Literal["unsupported"] = "unsupported"


SafeguardStatus = Annotated[
    AvailableStatus | UnavailableStatus | UnsupportedStatus, Discriminator("type")
]


class SafeguardResult(BaseModel):
    """One entry of `safeguard_results`: the verdicts of one safeguard for this turn."""

    type: Literal["dangerous_tool_use"] = "dangerous_tool_use"
    status: SafeguardStatus


def wants_tool_use_check(safeguards: list[SafeguardRequest] | None) -> bool:
    """Whether the request asks for the dangerous-tool-use check."""
    return any(entry.type == DANGEROUS_TOOL_USE for entry in safeguards or ())


def classifier_context(safeguards: list[SafeguardRequest] | None) -> dict[str, Any]:
    """The dangerous-tool-use entry's context ({} when it sent none)."""
    for entry in safeguards or ():
        if entry.type == DANGEROUS_TOOL_USE:
            return entry.classifier_context or {}
    return {}
