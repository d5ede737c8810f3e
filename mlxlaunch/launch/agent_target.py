"""What every agent is told about the server, and what an integration answers with.

`AgentTarget` is the server as any client sees it (URL, per-launch token, the served model's
settings as `claude_env.client_settings` derived them once); an integration's `configure`
turns it into an `AgentSetup`: variables, an argv prefix, and files for the per-launch
directory. `agent_environment` and `write_setup` apply it the same way for every agent.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mlxlaunch.home import PRIVATE_FILE_MODE, private_dir
from mlxlaunch.runstate import ClientSettings


@dataclass(frozen=True)
class AgentTarget:
    """The running server and the model it serves, as an agent should see them."""

    base_url: str  # e.g. http://127.0.0.1:8080 (no /v1)
    auth_token: str
    settings: ClientSettings
    cwd: Path | None = None  # where the agent runs (Codex trusts it: see codex_config)

    @property
    def openai_base_url(self) -> str:
        """The base URL OpenAI clients take: the server's, with `/v1`."""
        return self.base_url.rstrip("/") + "/v1"


@dataclass(frozen=True)
class AgentSetup:
    """How one agent is pointed at the server."""

    env: Mapping[str, str] = field(default_factory=dict)  # set on top of the user's
    args: tuple[str, ...] = ()  # before the user's own arguments
    files: Mapping[str, str] = field(default_factory=dict)  # relative path -> text
    # Name in the launch directory -> what it links to, if that exists (the user's own files).
    links: Mapping[str, Path] = field(default_factory=dict)
    # Name in the launch directory -> a directory kept across launches (made if missing).
    kept_dirs: Mapping[str, Path] = field(default_factory=dict)


def agent_environment(
    setup: AgentSetup,
    inherited: Mapping[str, str],
    *,
    drops: Iterable[str] = (),
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The child's whole environment: the user's less `drops`, ours on top, then `--env`."""
    dropped = set(drops)
    env = {k: v for k, v in inherited.items() if k not in dropped}
    env.update(setup.env)
    env.update(extra or {})
    return env


def write_setup(setup: AgentSetup, launch_dir: Path) -> None:
    """Write the setup's files (0600) and links into `launch_dir`, which exists and is private."""
    for relative, text in setup.files.items():
        path = launch_dir / relative
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    for name, kept in setup.kept_dirs.items():
        (launch_dir / name).symlink_to(private_dir(kept))
    for name, target in setup.links.items():
        if target.exists():
            (launch_dir / name).symlink_to(target)
