"""The agents `mlx launch` starts, as one table: binary, API, settings, and what to clean up.

Each entry says where its CLI comes from (a name on PATH, else one pinned npm release installed
into `<home>/<install_dir>/<version>`), which of our APIs it speaks, and how it is pointed at
the server: a pure `configure(target, launch_dir)` that returns the child's variables, argv
prefix and the files to write into a private per-launch directory, which is removed when the
agent exits. No entry writes to the user's own configuration files.

Adding an agent that installs from npm and takes a base URL (droid, qwen, cline, …) is one more
`Integration(...)` in `INTEGRATIONS` with its `configure` function; the session (launch/session.py),
the install path (launch/agent_bin.py) and the CLI (cli/launch.py) take it from here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from mlxlaunch.launch import claude_env, codex_config, opencode_config
from mlxlaunch.launch.agent_target import AgentSetup, AgentTarget

# Which of the server's APIs an agent calls: Anthropic Messages, OpenAI Responses, Chat Completions.
Api = Literal["messages", "responses", "chat"]
API_PATHS: Mapping[Api, str] = {
    "messages": "/v1/messages",
    "responses": "/v1/responses",
    "chat": "/v1/chat/completions",
}


# The Claude Code release this product is tested against (its captured requests live in
# tests/fixtures/claude-code-<version>). The Makefile and the end-to-end tests read it here.
CLAUDE_CODE_VERSION = "2.1.332"
CLAUDE_CODE_PACKAGE = "@anthropic-ai/claude-code"

# How every pinned agent is installed: npm's audit, funding and update notices, and its
# dependencies' deprecation warnings, are noise to a user who asked for one exact release;
# errors still show (the install's failure hint points at them). An exact version never
# changes, so npm's cache is as good as the registry: a reinstall needs no network.
NPM_INSTALL_FLAGS = (
    "--no-audit",
    "--no-fund",
    "--no-update-notifier",
    "--loglevel=error",
    "--prefer-offline",
)


@dataclass(frozen=True)
class NpmRelease:
    """The one release of an agent's npm package that mlxlaunch installs and is tested with."""

    package: str
    version: str
    bin_name: str  # the executable npm links into node_modules/.bin


@dataclass(frozen=True)
class Integration:
    """One agent `mlx launch <name>` can start."""

    name: str  # the subcommand: `mlx launch <name>`
    title: str  # how people call it
    binary: str  # the executable looked up on PATH
    release: NpmRelease
    install_dir: str  # under the mlxlaunch home: `<home>/<install_dir>/<version>`
    api: Api
    configure: Callable[[AgentTarget, Path], AgentSetup]
    # What the launcher sets, in one line each (README's integrations table, `--help`).
    sets: tuple[str, ...] = ()
    # Where the compaction point is for this agent (shown in the announcement; None: not known).
    compact_at: Callable[[int, int], int] | None = None
    # Inherited variables that would send the agent to another provider.
    drops: tuple[str, ...] = field(default_factory=tuple)
    # The agent sends background work (titles, summaries) to a model of its own naming, which
    # a small model served beside the main one answers (`--small-model`): False, none is
    # loaded for it (Codex has no such tier).
    small_tier: bool = False

    @property
    def install_flag(self) -> str:
        """The flag that installs the pinned release without asking."""
        return f"--install-{self.name}"


CLAUDE = Integration(
    name="claude",
    title="Claude Code",
    binary="claude",
    release=NpmRelease(CLAUDE_CODE_PACKAGE, CLAUDE_CODE_VERSION, "claude"),
    install_dir="claude-code",
    api="messages",
    configure=claude_env.configure,
    sets=(
        "ANTHROPIC_BASE_URL, ANTHROPIC_AUTH_TOKEN (per-launch token)",
        "ANTHROPIC_MODEL and the tier variables: the served model (the haiku tier: the small "
        "model, with --small-model)",
        "CLAUDE_CODE_MAX_CONTEXT_TOKENS, CLAUDE_CODE_MAX_OUTPUT_TOKENS: its window and budget",
    ),
    compact_at=claude_env.compaction_threshold,
    drops=claude_env.PROVIDER_SWITCHES,
    small_tier=True,
)

CODEX = Integration(
    name="codex",
    title="Codex CLI",
    binary="codex",
    release=NpmRelease("@openai/codex", codex_config.CODEX_VERSION, "codex"),
    install_dir="codex",
    api="responses",
    configure=codex_config.configure,
    sets=(
        "CODEX_HOME: a per-launch directory with its own config.toml (yours is not read)",
        'config.toml: model_providers.mlx (base_url <server>/v1, wire_api = "responses", env_key)',
        "model, model_context_window, model_auto_compact_token_limit: the served model's",
        f"{codex_config.TOKEN_VARIABLE}: the per-launch token",
    ),
    compact_at=codex_config.auto_compact_limit,
    drops=codex_config.PROVIDER_VARIABLES,
)

OPENCODE = Integration(
    name="opencode",
    title="opencode",
    binary="opencode",
    release=NpmRelease("opencode-ai", opencode_config.OPENCODE_VERSION, "opencode"),
    install_dir="opencode",
    api="chat",
    configure=opencode_config.configure,
    small_tier=True,
    sets=(
        "OPENCODE_CONFIG_CONTENT: provider mlx (@ai-sdk/openai-compatible, baseURL <server>/v1)",
        "model mlx/<id> (small_model: the small model's, with --small-model), limit.context "
        "and limit.output: the served model's",
        f"{opencode_config.TOKEN_VARIABLE}: the per-launch token (apiKey reads it)",
        "OPENCODE_DISABLE_AUTOUPDATE, OPENCODE_DISABLE_MODELS_FETCH",
    ),
    compact_at=None,
)

INTEGRATIONS: Mapping[str, Integration] = {i.name: i for i in (CLAUDE, CODEX, OPENCODE)}


def integration(name: str) -> Integration:
    """The entry for `name`; raises KeyError naming the ones there are."""
    try:
        return INTEGRATIONS[name]
    except KeyError:
        raise KeyError(f"no integration {name!r} (there are: {', '.join(INTEGRATIONS)})") from None
