"""Codex CLI pointed at our server: a per-launch `CODEX_HOME` with its own `config.toml`.

The user's `~/.codex` is never read nor written: Codex reads everything from `CODEX_HOME`, so
the launcher gives it a private directory under the mlxlaunch home, removed on exit. In it:

- `config.toml` (no secret in it): `model_providers.mlx` with `base_url` = server + `/v1`,
  `wire_api = "responses"` and `env_key` naming the variable that holds the per-launch token
  (Codex sends it as a bearer token); `model_provider = "mlx"`, `model`, and the served
  model's `model_context_window` and `model_auto_compact_token_limit`, so Codex compacts
  before the window is full; the directory Codex starts in marked trusted (else `codex` asks
  at every launch, as the home is new each time) with Codex's usual workspace-write sandbox.
  `codex exec` still runs only inside a git repository unless the user passes its own
  `--skip-git-repo-check`: that rule is Codex's, and the launcher does not lift it.
- `sessions/` links to `<home>/agents/codex/sessions`, so `codex resume` finds earlier local
  sessions; `AGENTS.md` links to the user's `~/.codex/AGENTS.md` when there is one. Nothing
  else is taken from `~/.codex` (no `auth.json`: the local provider needs no login, and a
  ChatGPT token has no business near a local server).

Read from the installed Codex 0.171.0 (`strings` on its native binary, `codex debug models`):
it has no `model_max_output_tokens` key and sends no `max_output_tokens`, so the output budget
is the server's. A `model_catalog_json` entry must carry a whole base prompt
(`base_instructions`); without one Codex keeps its own default prompt and tools (`exec_command`
…, as in tests/fixtures/codex-0.171.0) and prints one "fallback metadata" warning, which is
what the launcher chooses: the window and compaction keys above override the fallback's.
"""

from __future__ import annotations

import json
from pathlib import Path

from mlxlaunch.home import mlxlaunch_home
from mlxlaunch.launch.agent_target import AgentSetup, AgentTarget

CODEX_VERSION = "0.171.0"
PROVIDER_ID = "mlx"
TOKEN_VARIABLE = "MLX_LAUNCH_API_KEY"
# Variables that would send Codex elsewhere or to another home; the launcher sets its own.
PROVIDER_VARIABLES = ("OPENAI_BASE_URL", "CODEX_HOME")
# Local prefill of Codex's ~20k-token prompt can take minutes on a small machine.
STREAM_IDLE_TIMEOUT_MS = 3_600_000
# Compact at this share of the window at most (Codex's own rule for its models is 90%).
COMPACT_SHARE = 0.9


def auto_compact_limit(context_window: int, max_output: int) -> int:
    """The prompt size at which Codex should compact: room for one reply, at most 90% of the
    window, never below half of it."""
    room = context_window - max_output
    return max(context_window // 2, min(int(context_window * COMPACT_SHARE), room))


def codex_dirs(home: Path | None = None) -> Path:
    """Where mlxlaunch keeps Codex's per-launch homes and its sessions."""
    return (home or mlxlaunch_home()) / "agents" / "codex"


def _toml(value: str | int | bool) -> str:
    # JSON's string escapes are TOML basic-string escapes; ints and booleans read the same.
    return json.dumps(value)


def config_toml(target: AgentTarget) -> str:
    """The `config.toml` for `target` (no token: Codex reads it from TOKEN_VARIABLE)."""
    s = target.settings
    lines = [
        "# Written by `mlx launch codex` for this launch only; removed when Codex exits.",
        f"model_provider = {_toml(PROVIDER_ID)}",
        f"model = {_toml(s.model_id)}",
        f"model_context_window = {s.context_window}",
        f"model_auto_compact_token_limit = "
        f"{auto_compact_limit(s.context_window, s.max_output_tokens)}",
        "check_for_update_on_startup = false",
        'sandbox_mode = "workspace-write"',
        "",
        f"[model_providers.{PROVIDER_ID}]",
        'name = "mlx (local)"',
        f"base_url = {_toml(target.openai_base_url)}",
        'wire_api = "responses"',
        f"env_key = {_toml(TOKEN_VARIABLE)}",
        f"stream_idle_timeout_ms = {STREAM_IDLE_TIMEOUT_MS}",
    ]
    if target.cwd is not None:
        lines += ["", f"[projects.{_toml(str(target.cwd))}]", 'trust_level = "trusted"']
    return "\n".join(lines) + "\n"


def configure(target: AgentTarget, launch_dir: Path) -> AgentSetup:
    """Codex's setup: CODEX_HOME is `launch_dir`, holding config.toml and the links."""
    user_codex = Path.home() / ".codex"
    return AgentSetup(
        env={"CODEX_HOME": str(launch_dir), TOKEN_VARIABLE: target.auth_token},
        files={"config.toml": config_toml(target)},
        links={"AGENTS.md": user_codex / "AGENTS.md"},
        kept_dirs={"sessions": codex_dirs() / "sessions"},
    )
