"""Which recorded session an agent's command line resumes, and where its transcript is.

Claude Code: `--resume ID` (`-r ID`, `--resume=ID`) names a session of the project, its file
`<config>/projects/<slug>/<ID>.jsonl`; `--continue` (`-c`) takes the project's newest one.
The config directory is `$CLAUDE_CONFIG_DIR`, else `~/.claude`; the slug is the working
directory with every character but letters and digits made a dash. `--resume` alone opens
Claude Code's picker: no session can be known before the user picks one.

Codex CLI: `codex resume ID` / `codex resume --last` (also `codex exec resume …`): the
rollout under `$CODEX_HOME` (else `~/.codex`) `/sessions/YYYY/MM/DD/rollout-*-ID.jsonl`, or
the newest one recorded in this working directory (the newest of all when none records one).

Nothing here opens a file for writing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from mlxlaunch.launch.codex_config import codex_dirs

CLAUDE_RESUME = ("--resume", "-r")
CLAUDE_CONTINUE = ("--continue", "-c")
CODEX_LAST = "--last"
# Lines of a rollout read to find its session_meta (it comes first).
_META_LINES = 5


def _home(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("HOME") or Path.home())


def claude_projects(environ: Mapping[str, str]) -> Path:
    """Where Claude Code keeps its projects' transcripts."""
    config = environ.get("CLAUDE_CONFIG_DIR")
    return (Path(config) if config else _home(environ) / ".claude") / "projects"


def project_slug(cwd: Path) -> str:
    """The directory name Claude Code gives the project at `cwd`."""
    return "".join(c if c.isalnum() else "-" for c in str(cwd))


def _claude_request(args: Sequence[str]) -> tuple[str, str | None] | None:
    """("resume", ID) or ("continue", None) from Claude Code's arguments, or None."""
    for index, arg in enumerate(args):
        if arg == "--":
            break
        if arg.startswith("--resume="):
            return ("resume", arg.partition("=")[2] or None)
        if arg in CLAUDE_RESUME:
            following = args[index + 1] if index + 1 < len(args) else None
            if following and not following.startswith("-"):
                return ("resume", following)
            return None  # the picker
        if arg in CLAUDE_CONTINUE:
            return ("continue", None)
    return None


def _newest(paths: list[Path]) -> Path | None:
    existing = [p for p in paths if p.is_file()]
    return max(existing, key=lambda p: p.stat().st_mtime) if existing else None


def claude_session_file(args: Sequence[str], cwd: Path, environ: Mapping[str, str]) -> Path | None:
    """The transcript Claude Code's `args` resume in `cwd`, or None (none asked, or none
    found)."""
    asked = _claude_request(args)
    if asked is None:
        return None
    projects = claude_projects(environ)
    project = projects / project_slug(cwd)
    kind, session = asked
    if kind == "continue":
        sessions = project.glob("*.jsonl") if project.is_dir() else []
        return _newest([p for p in sessions if not p.name.startswith("agent-")])
    if not session or "/" in session or session.startswith("."):
        return None
    here = project / f"{session}.jsonl"
    if here.is_file():
        return here
    return _newest(list(projects.glob(f"*/{session}.jsonl"))) if projects.is_dir() else None


def codex_sessions(environ: Mapping[str, str]) -> list[Path]:
    """Where Codex CLI keeps its rollouts: its own home's (`$CODEX_HOME`, else `~/.codex`),
    and the one `mlx launch codex` keeps across launches (launch/codex_config.py), which is
    where the sessions that launch ran are."""
    home = environ.get("CODEX_HOME")
    own = (Path(home) if home else _home(environ) / ".codex") / "sessions"
    return [own, codex_dirs() / "sessions"]


def _codex_request(args: Sequence[str]) -> str | None:
    """The session id, or CODEX_LAST, that `codex [exec] resume …` asks for; None otherwise."""
    words = [a for a in args if a != "--"]
    if "resume" not in words:
        return None
    after = words[words.index("resume") + 1 :]
    if CODEX_LAST in after:
        return CODEX_LAST
    ids = [a for a in after if not a.startswith("-")]
    return ids[0] if ids else None


def _rollout_cwd(path: Path) -> str | None:
    try:
        with path.open(encoding="utf-8", errors="replace") as lines:
            for _, line in zip(range(_META_LINES), lines, strict=False):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("type") == "session_meta":
                    cwd = (record.get("payload") or {}).get("cwd")
                    return cwd if isinstance(cwd, str) else None
    except (OSError, ValueError):
        return None
    return None


def codex_session_file(args: Sequence[str], cwd: Path, environ: Mapping[str, str]) -> Path | None:
    """The rollout `codex … resume` resumes, or None (none asked, or none found)."""
    asked = _codex_request(args)
    if asked is None:
        return None
    rollouts = [p for root in codex_sessions(environ) for p in root.glob("*/*/*/rollout-*.jsonl")]
    if asked != CODEX_LAST:
        return _newest([p for p in rollouts if p.stem.endswith(asked)])
    here = [p for p in rollouts if _rollout_cwd(p) == str(cwd)]
    return _newest(here or rollouts)


def resumed_session_file(
    agent: str, args: Sequence[str], cwd: Path, environ: Mapping[str, str]
) -> Path | None:
    """The transcript `agent` run with `args` in `cwd` will resume, or None."""
    if agent == "claude":
        return claude_session_file(args, cwd, environ)
    if agent == "codex":
        return codex_session_file(args, cwd, environ)
    return None
