"""The environment that points a `claude` child at our server (see shared/PROTOCOL.md).

Pure functions: given the server's URL, token and the served model's facts, return the child's
environment. Everything the user had stays, except the variables that would send Claude Code
to another provider; the user's `--env` pairs are applied last and win.

`client_settings` is the one derivation of what Claude Code is told (model ids, window, output
budget, where it will compact): `mlx launch claude`, `mlx serve`'s announcement, the state file
and `--print-env` all go through it, so they cannot disagree with each other or the server.

What Claude Code 2.1.332 does with these (read from its bundle):
- CLAUDE_CODE_MAX_CONTEXT_TOKENS is its window only for ids it does not recognise as Claude
  models; for those it assumes 1M tokens without it. It recognises more than a `claude-` start:
  any id containing e.g. `claude-sonnet-4-6` or `claude-3-` (so `local-claude-sonnet-4-6` is
  Claude Sonnet 4.6 to it, with a 200k/1M window).
- It compacts when the prompt reaches window - min(output budget, 20k) - 13k. No variable
  moves that point later: CLAUDE_AUTOCOMPACT_PCT_OVERRIDE only lowers it, and
  CLAUDE_CODE_AUTO_COMPACT_WINDOW is capped at the window and rounds values under 100k up
  (with a warning), so the output budget is what keeps room for a conversation.
- In `-p` mode it prints `[claude-code:unrecognized_model] {...}` once for every id that is not
  a Claude model or described by Anthropic's signed model catalog. No id avoids that line and
  keeps the window honoured, so the ids stay non-Claude and the line stays.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mlxlaunch.launch.agent_target import AgentSetup, AgentTarget
from mlxlaunch.runstate import ClientSettings

# Claude Code's own default for unknown model ids; never ask for more than this.
CLAUDE_DEFAULT_MAX_OUTPUT = 32_000
# Claude Code's compaction rule: it reserves min(output budget, OUTPUT_RESERVE_CAP) for the
# reply and keeps COMPACT_MARGIN more free (2.1.332: `gse`/`QG` in its bundle).
OUTPUT_RESERVE_CAP = 20_000
COMPACT_MARGIN = 13_000
# Compact no earlier than at half the window: Claude Code's own first prompt is ~12k tokens,
# so on a 32k window a quarter-window budget would make it compact before the first reply.
COMPACT_AT_LEAST = 0.5
MIN_OUTPUT = 1024
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


# What Claude Code reads as a Claude model inside a longer id (its canonical-name rule matches
# substrings such as `claude-opus-4-7` and `claude-3-5-haiku`).
_CLAUDE_FAMILY = re.compile(r"claude-(?=(?:opus|sonnet|haiku|fable|mythos|instant|3-))", re.I)


def claude_model_id(name: str) -> str:
    """A model id Claude Code takes at face value.

    Claude Code ignores CLAUDE_CODE_MAX_CONTEXT_TOKENS for ids it takes for Claude models
    (starting with `claude-`, containing a Claude family name such as `claude-sonnet-4-6`, or
    tagged `[1m]`) and assumes 200k/1M: such names get a `local-` prefix, lose the tag, and
    have `claude-<family>` written `claude_<family>`.
    """
    # Here, not at the top: `protocol` brings pydantic's models, which `mlx --help` (and every
    # command that only names a model) must not pay for.
    from mlxlaunch.protocol.limits import plain_model_id

    bare = name.replace("[1m]", "").strip()
    # A path is not a model id the server accepts (it refuses paths and URLs): use its last part.
    model_id = plain_model_id(bare) if bare else "local-model"
    if model_id.lower().startswith("claude-"):
        model_id = "local-" + model_id
    return _CLAUDE_FAMILY.sub(lambda m: m.group(0)[:-1] + "_", model_id)


def compaction_threshold(context_window: int, max_output: int) -> int:
    """The prompt size at which Claude Code compacts, for this window and output budget
    (0: at every turn, a window too small for Claude Code)."""
    return max(0, context_window - min(max_output, OUTPUT_RESERVE_CAP) - COMPACT_MARGIN)


def max_output_tokens(context_window: int) -> int:
    """An output budget that leaves most of the window to the prompt.

    A quarter of the window (at most Claude Code's default), lowered on small windows so that
    Claude Code compacts no earlier than at half the window (see `compaction_threshold`): on a
    32k model a quarter would put the compaction point below Claude Code's own first prompt.
    """
    quarter = min(CLAUDE_DEFAULT_MAX_OUTPUT, context_window // 4)
    room = int(context_window * (1 - COMPACT_AT_LEAST)) - COMPACT_MARGIN
    return max(MIN_OUTPUT, min(quarter, room))


def client_settings(
    model_id: str,
    context_window: int,
    *,
    small_model_id: str | None = None,
    max_output: int | None = None,
) -> ClientSettings:
    """What Claude Code is told about a model served with `context_window`.

    `max_output`: the output budget asked for (--max-output-tokens, a test model's cap); None:
    derived from the window. Never more than the window. Applying this to its own result gives
    the same result, so a reader of the state file may pass it through again.
    """
    main = claude_model_id(model_id)
    out = min(max_output or max_output_tokens(context_window), context_window)
    return ClientSettings(
        model_id=main,
        small_model_id=claude_model_id(small_model_id) if small_model_id else main,
        context_window=context_window,
        max_output_tokens=out,
        compact_at=compaction_threshold(context_window, out),
    )


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

    @classmethod
    def of(
        cls,
        base_url: str,
        auth_token: str,
        settings: ClientSettings,
        extra: Mapping[str, str] | None = None,
    ) -> ClaudeTarget:
        """The target for a server whose client settings are known."""
        return cls(
            base_url=base_url,
            auth_token=auth_token,
            model_id=settings.model_id,
            context_window=settings.context_window,
            small_model_id=settings.small_model_id,
            max_output_tokens=settings.max_output_tokens,
            extra=extra or {},
        )

    def settings(self) -> ClientSettings | None:
        """The client settings this target means; None while the window is unknown."""
        if self.context_window is None:
            return None
        return client_settings(
            self.model_id,
            self.context_window,
            small_model_id=self.small_model_id,
            max_output=self.max_output_tokens,
        )


def launch_variables(target: ClaudeTarget) -> dict[str, str]:
    """Only the variables mlxlaunch sets (no inherited environment, no --env)."""
    settings = target.settings()
    model_id = claude_model_id(target.model_id)
    small_id = claude_model_id(target.small_model_id) if target.small_model_id else model_id
    variables = {
        "ANTHROPIC_BASE_URL": target.base_url.rstrip("/"),
        "ANTHROPIC_AUTH_TOKEN": target.auth_token,
        "ANTHROPIC_API_KEY": "",  # empty, so Claude Code takes the bearer-token path
    }
    if settings is not None:
        model_id, small_id = settings.model_id, settings.small_model_id
        variables["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] = str(settings.context_window)
        variables["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(settings.max_output_tokens)
    elif target.max_output_tokens is not None:
        variables["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(target.max_output_tokens)
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


def configure(target: AgentTarget, launch_dir: Path) -> AgentSetup:
    """Claude Code's entry in the integrations table: variables only (`launch_dir` unused)."""
    del launch_dir
    claude = ClaudeTarget.of(target.base_url, target.auth_token, target.settings)
    return AgentSetup(env=launch_variables(claude))


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
