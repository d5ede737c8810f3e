"""The parts of an agent's request its transcript leaves out, from a captured request.

Claude Code's transcript records the conversation but not the system prompt, the tools, the
context it prepends to the first user message (`<system-reminder>` blocks) or the
`# Environment` system turn after it; Codex's rollout records every input item but not the
tools. Both are taken from a request the agent's pinned version really sent (copies of
`tests/fixtures/…` ship here; a test keeps them equal), the working directory put back where
the capture had its own. A live agent of another version, or with other tools (MCP servers),
sends other text there, and reuse of a rebuilt prompt ends where they differ.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from importlib import resources
from typing import Any

CLAUDE_TEMPLATE = "claude_code_2.1.332_request.json"
CLAUDE_VERSION = "2.1.332"
CLAUDE_CWD = "/home/dev/project"  # the captured session's working directory
CODEX_TEMPLATE = "codex_0.171.0_request.json"
CODEX_VERSION = "0.171.0"
CODEX_CWD = "/home/user/project"


@cache
def _load(name: str) -> dict[str, Any]:
    text = resources.files("mlxlaunch.launch.transcripts.data").joinpath(name).read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def claude_template(cwd: str | None = None) -> dict[str, Any]:
    """A copy of the captured Claude Code request body, with `cwd` for the capture's own."""
    return _with_cwd(_load(CLAUDE_TEMPLATE)["body"], CLAUDE_CWD, cwd)


def codex_template(cwd: str | None = None) -> dict[str, Any]:
    """A copy of the captured Codex request body, with `cwd` for the capture's own."""
    return _with_cwd(_load(CODEX_TEMPLATE), CODEX_CWD, cwd)


def _with_cwd(body: dict[str, Any], captured: str, cwd: str | None) -> dict[str, Any]:
    if not cwd or cwd == captured:
        return copy.deepcopy(body)
    replaced: dict[str, Any] = json.loads(json.dumps(body).replace(captured, _json_inner(cwd)))
    return replaced


def _json_inner(text: str) -> str:
    """`text` as it stands inside a JSON string (quotes and backslashes escaped)."""
    return json.dumps(text)[1:-1]
