"""The environment that points a `claude` child at our server (see shared/PROTOCOL.md).

Pure functions: given the server's URL, token and the served model's facts, return the child's
environment. Everything the user had stays, except the variables that would send Claude Code
to another provider; the user's `--env` pairs are applied last and win.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from mlxlaunch.protocol.limits import plain_model_id

# Claude Code's own default for unknown model ids; never ask for more than this.
CLAUDE_DEFAULT_MAX_OUTPUT = 32_000
# Local prefill of a ~20k-token prompt can take minutes on small machines; the server pings
# during prefill, so this only bounds a request that truly hangs.
API_TIMEOUT_MS = 3_600_000

# These switch Claude Code to Bedrock/Vertex/Foundry, which would bypass our server entirely.
PROVIDER_SWITCHES = (
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
    "CLAUDE_CODE_USE_FOUNDRY",
)

TIER_VARIABLES = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "CLAUDE_CODE_SUBAGENT_MODEL",
)
SMALL_TIER_VARIABLES = (
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",  # older name of the haiku tier, still read by Claude Code
)


def claude_model_id(name: str) -> str:
    """A model id Claude Code takes at face value.

    Claude Code ignores CLAUDE_CODE_MAX_CONTEXT_TOKENS for ids starting with `claude-` or
    containing `[1m]` (it assumes 200k/1M), so such names get a `local-` prefix / lose the tag.
    """
    bare = name.replace("[1m]", "").strip()
    # A path is not a model id the server accepts (it refuses paths and URLs): use its last part.
    model_id = plain_model_id(bare) if bare else "local-model"
    if model_id.lower().startswith("claude-"):
        model_id = "local-" + model_id
    return model_id


def max_output_tokens(context_window: int) -> int:
    """An output budget that leaves most of the window to the prompt.

    Claude Code reserves the output budget out of the window when it decides to compact, and
    its own prompt alone is ~20k tokens, so a quarter of the window (at most Claude Code's
    default) keeps both working on 32k-token models.
    """
    return max(1024, min(CLAUDE_DEFAULT_MAX_OUTPUT, context_window // 4))


@dataclass(frozen=True)
class ClaudeTarget:
    """The served model and server, as Claude Code should see them."""

    base_url: str
    auth_token: str
    model_id: str
    context_window: int | None  # None: unknown (Claude Code then assumes its own default)
    small_model_id: str | None = None
    max_output_tokens: int | None = None  # None: derived from the window
    extra: Mapping[str, str] = field(default_factory=dict)  # --env pairs, applied last


def launch_variables(target: ClaudeTarget) -> dict[str, str]:
    """Only the variables mlxlaunch sets (no inherited environment, no --env)."""
    model_id = claude_model_id(target.model_id)
    small_id = claude_model_id(target.small_model_id) if target.small_model_id else model_id
    variables = {
        "ANTHROPIC_BASE_URL": target.base_url.rstrip("/"),
        "ANTHROPIC_AUTH_TOKEN": target.auth_token,
        "ANTHROPIC_API_KEY": "",  # empty, so Claude Code takes the bearer-token path
    }
    window = target.context_window
    if window is not None:
        variables["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] = str(window)
    out = target.max_output_tokens or (max_output_tokens(window) if window else None)
    if out is not None:
        variables["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(min(out, window) if window else out)
    variables |= {
        "API_TIMEOUT_MS": str(API_TIMEOUT_MS),
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
    }
    variables.update(dict.fromkeys(TIER_VARIABLES, model_id))
    variables.update(dict.fromkeys(SMALL_TIER_VARIABLES, small_id))
    return variables


def claude_environment(target: ClaudeTarget, inherited: Mapping[str, str]) -> dict[str, str]:
    """The child's whole environment: the user's, ours on top, then the user's --env pairs."""
    env = {k: v for k, v in inherited.items() if k not in PROVIDER_SWITCHES}
    env.update(launch_variables(target))
    env.update(target.extra)
    return env


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_env_pairs(pairs: list[str]) -> dict[str, str]:
    """Parse `--env KEY=VALUE` options; raises ValueError naming the bad one."""
    parsed: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not _ENV_NAME.match(key):
            raise ValueError(f"--env expects KEY=VALUE, got {pair!r}")
        parsed[key] = value
    return parsed


def export_lines(variables: Mapping[str, str]) -> str:
    """POSIX-shell `export` lines for `mlx launch claude --print-env`."""
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in variables.items())
