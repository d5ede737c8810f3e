"""opencode pointed at our server: one JSON config in `OPENCODE_CONFIG_CONTENT`.

opencode merges `OPENCODE_CONFIG_CONTENT` over the user's own config files, which stay as they
are, unread by us and unwritten. The config declares a provider `mlx` on the AI SDK's
`@ai-sdk/openai-compatible` (which opencode bundles: no download), `options.baseURL` = server +
`/v1` (Chat Completions), `options.apiKey` = `{env:MLX_LAUNCH_API_KEY}` (opencode's own
substitution: the token is in the environment only), one model with the served window and
output budget (`limit.context`, `limit.output`: opencode compacts when a prompt nears
context - output), and makes it the default and small model (`small_model`: opencode's titles
and summaries; a small model served beside the main one, `default-small-model`, when there is
one). Auto-update and the models.dev
catalog fetch are switched off: a local session needs neither, and both reach the network.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlxlaunch.launch.agent_target import AgentSetup, AgentTarget

OPENCODE_VERSION = "1.18.33"
PROVIDER_ID = "mlx"
TOKEN_VARIABLE = "MLX_LAUNCH_API_KEY"


def opencode_config(target: AgentTarget) -> dict[str, Any]:
    """The config object for `target` (no token: `apiKey` names the variable)."""
    s = target.settings
    model = f"{PROVIDER_ID}/{s.model_id}"
    limit = {"context": s.context_window, "output": s.max_output_tokens}
    models = {
        name: {"name": name, "tool_call": True, "limit": limit}
        for name in dict.fromkeys((s.model_id, s.small_model_id))
    }
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER_ID: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "mlx (local)",
                "options": {
                    "baseURL": target.openai_base_url,
                    "apiKey": "{env:" + TOKEN_VARIABLE + "}",
                },
                "models": models,
            }
        },
        "model": model,
        "small_model": f"{PROVIDER_ID}/{s.small_model_id}",
        "autoupdate": False,
        "share": "disabled",
    }


def configure(target: AgentTarget, launch_dir: Path) -> AgentSetup:
    """opencode's setup: everything in its environment; `launch_dir` stays empty."""
    del launch_dir  # opencode takes its whole config from the environment
    return AgentSetup(
        env={
            "OPENCODE_CONFIG_CONTENT": json.dumps(opencode_config(target), indent=2),
            TOKEN_VARIABLE: target.auth_token,
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
        }
    )
