"""Warm resume: a resumed agent session's conversation prefilled while the agent starts.

`mlx launch claude -- --resume ID` (or `--continue`, or `mlx launch codex -- resume …`)
would otherwise make the first resumed turn prefill the whole recorded conversation — minutes
for a long session on a laptop. The launcher reads that session's transcript (read only,
`launch/transcripts`), rebuilds the request the agent will send, up to where the user's new
words begin, and sends it to the server it just started, with one output token, on a thread
of its own: the server renders it exactly as it will render the agent's request (same
mapping, same renderer) and keeps it in its prefix cache, or finds it in the disk tier. The
agent's first turn then prefills only what is new.

Reuse reaches as far as the rebuilt request equals the agent's real one. What transcripts do
not record comes from the agent's captured request (transcripts/templates.py): the same
version with the same tools gives the same prompt; another version or an MCP server's tools
make reuse stop where they differ (the server's `/v1/stats` says where). A turn the user sends
before the warm-up is done prefills beside it instead.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from mlxlaunch.launch.transcripts import Transcript, read_transcript
from mlxlaunch.launch.transcripts.locate import resumed_session_file

log = logging.getLogger(__name__)

# A prefill of a long session on a slow machine takes minutes; the load comes first.
WARM_TIMEOUT_S = 3600.0
ANTHROPIC_VERSION = "2023-06-01"


@dataclass
class ResumeWarmth:
    """The warm-up of one resumed session: what it read and, once `thread` ends, how it went
    (`prompt_tokens`, `cached_tokens` before it, `seconds`, or `error`)."""

    transcript: Transcript
    thread: threading.Thread | None = None
    outcome: dict[str, Any] = field(default_factory=dict)

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until the warm-up ends (or `timeout`); its outcome so far."""
        if self.thread is not None:
            self.thread.join(timeout)
        return self.outcome


def warm_request(transcript: Transcript) -> tuple[str, dict[str, Any], dict[str, str]]:
    """The path, body and headers that prefill `transcript`'s conversation: the request its
    agent sends on resuming, not streamed, with one output token."""
    body = copy.deepcopy(transcript.resume_body)
    body["stream"] = False
    if transcript.api == "messages":
        body["max_tokens"] = 1
        headers = {"anthropic-version": ANTHROPIC_VERSION,
                   "x-claude-code-session-id": transcript.session_id}  # fmt: skip
        return "/v1/messages", body, headers
    body["max_output_tokens"] = 1
    body["store"] = False
    return "/v1/responses", body, {"session-id": transcript.session_id}


def _usage(answer: dict[str, Any]) -> tuple[int | None, int | None]:
    """(prompt tokens, cached tokens) of a Messages or Responses answer."""
    usage = answer.get("usage") or {}
    if "input_tokens_details" in usage or "output_tokens_details" in usage:
        cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
        return usage.get("input_tokens"), cached
    cached = usage.get("cache_read_input_tokens") or 0
    fresh = (usage.get("input_tokens") or 0) + (usage.get("cache_creation_input_tokens") or 0)
    return fresh + cached, cached


def prefill(warmth: ResumeWarmth, url: str, token: str) -> None:
    """Send the warm-up request and record how it went in `warmth.outcome` (never raises:
    a failed warm-up leaves a cold first turn, nothing worse)."""
    path, body, headers = warm_request(warmth.transcript)
    headers = {**headers, "authorization": f"Bearer {token}"}
    start = time.perf_counter()
    try:
        with httpx.Client(timeout=httpx.Timeout(WARM_TIMEOUT_S, connect=10.0)) as client:
            response = client.post(url.rstrip("/") + path, json=body, headers=headers)
        if response.status_code != 200:
            warmth.outcome["error"] = f"HTTP {response.status_code}: {response.text[:200]}"
        else:
            prompt, cached = _usage(response.json())
            warmth.outcome.update(prompt_tokens=prompt, cached_tokens=cached)
    except (httpx.HTTPError, ValueError) as exc:
        warmth.outcome["error"] = f"{type(exc).__name__}: {exc}"
    warmth.outcome["seconds"] = time.perf_counter() - start
    if "error" in warmth.outcome:
        log.warning("warm resume of %s failed: %s", warmth.transcript.session_id,
                    warmth.outcome["error"])  # fmt: skip
    else:
        log.info(
            "warm resume of %s: %s prompt tokens ready (%s were cached already) in %.1f s",
            warmth.transcript.session_id, warmth.outcome["prompt_tokens"],
            warmth.outcome["cached_tokens"], warmth.outcome["seconds"],
        )  # fmt: skip


def warm_resumed_session(
    agent: str,
    args: Sequence[str],
    *,
    cwd: Path,
    environ: Mapping[str, str],
    url: str,
    token: str,
) -> ResumeWarmth | None:
    """Start prefilling the session `agent` run with `args` resumes, on a daemon thread;
    None when `args` resume nothing this machine has a transcript of.

    Raises:
        TranscriptError: the transcript is there but cannot be read into a conversation.
    """
    path = resumed_session_file(agent, args, cwd, environ)
    if path is None:
        return None
    warmth = ResumeWarmth(read_transcript(path))
    warmth.thread = threading.Thread(
        target=prefill, args=(warmth, url, token), name="mlxlaunch-warm-resume", daemon=True
    )
    warmth.thread.start()
    return warmth
