"""Finding `claude` (--claude-bin, PATH, the pinned install), installing the pinned release
with consent, Node.js's version, and refusing launches claude could not run.

npm and claude are stand-ins here: small executables in temporary directories (the narrow
boundary is "a program on PATH"); tests/e2e/test_npm_install.py runs the real npm.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mlxlaunch.errors import ClaudeNotFound
from mlxlaunch.launch.claude_bin import (
    CLAUDE_CODE_VERSION,
    find_claude,
    npm_install_command,
    pinned_claude,
    pinned_prefix,
)
from mlxlaunch.launch.claude_install import (
    ClaudeInstallFailed,
    find_or_install,
    install_claude_code,
    install_question,
)
from mlxlaunch.launch.node import (
    NODE_REQUIRED,
    NodeFacts,
    node_facts,
    node_problem,
    parse_node_version,
    runs_under_node,
)
from mlxlaunch.launch.terminal_check import NoTerminalForClaude, check_claude_can_start

REPO = Path(__file__).resolve().parent.parent

# npm's stand-in: records its arguments, then does what `npm install --prefix DIR …` does for
# Claude Code (a `claude` under DIR/node_modules/.bin), or fails when FAIL is in its name.
FAKE_NPM = """
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "npm-args.json"), "w") as f:
    json.dump(sys.argv[1:], f)
if "fail" in os.path.basename(here):
    print("npm error code E404", file=sys.stderr)
    sys.exit(1)
prefix = sys.argv[sys.argv.index("--prefix") + 1]
bin_dir = os.path.join(prefix, "node_modules", ".bin")
os.makedirs(bin_dir, exist_ok=True)
claude = os.path.join(bin_dir, "claude")
with open(claude, "w") as f:
    f.write("#!/bin/sh\\necho '2.1.332 (Claude Code)'\\n")
os.chmod(claude, 0o755)
"""


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def _fake_claude(path: Path) -> Path:
    return _executable(path, "#!/bin/sh\necho '9.9.9 (Fake Claude)'\n")


def _fake_npm(directory: Path) -> Path:
    return _executable(directory / "npm", f"#!{sys.executable}\n{FAKE_NPM}")


def _npm_args(directory: Path) -> list[str] | None:
    record = directory / "npm-args.json"
    return json.loads(record.read_text()) if record.exists() else None


# --- where claude is looked for -------------------------------------------------------------


def test_lookup_order_is_flag_then_path_then_pinned(tmp_path: Path) -> None:
    on_path = _fake_claude(tmp_path / "path" / "claude")
    prefix = tmp_path / "pinned"
    pinned = _fake_claude(pinned_claude(prefix))
    explicit = _fake_claude(tmp_path / "mine" / "my-claude")
    path = str(on_path.parent)
    empty = str(tmp_path / "empty")

    assert find_claude(str(explicit), path=path, prefix=prefix) == explicit.resolve()
    assert find_claude(None, path=path, prefix=prefix) == on_path
    assert find_claude(None, path=empty, prefix=prefix) == pinned
    # A name given with --claude-bin is looked up on PATH, never replaced by the pinned one.
    assert find_claude("claude", path=path, prefix=prefix) == on_path
    with pytest.raises(ClaudeNotFound, match="not found on PATH"):
        find_claude("claude", path=empty, prefix=prefix)
    with pytest.raises(ClaudeNotFound, match="not an executable file"):
        find_claude(str(tmp_path / "nowhere" / "claude"), path=path, prefix=prefix)


def test_nothing_found_names_the_pinned_install(tmp_path: Path) -> None:
    prefix = tmp_path / "pinned"
    pinned_claude(prefix).parent.mkdir(parents=True)
    pinned_claude(prefix).write_text("not executable")  # a half-finished install
    with pytest.raises(ClaudeNotFound) as raised:
        find_claude(None, path=str(tmp_path / "empty"), prefix=prefix)
    assert str(pinned_claude(prefix)) in raised.value.message
    hint = raised.value.hint or ""
    assert "mlx launch claude --install-claude" in hint and str(prefix) in hint
    assert CLAUDE_CODE_VERSION in hint and "npm install -g" not in hint


def test_the_pinned_install_lives_in_the_mlxlaunch_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    prefix = tmp_path / "home" / "claude-code" / CLAUDE_CODE_VERSION
    assert pinned_prefix() == prefix
    assert pinned_claude() == prefix / "node_modules" / ".bin" / "claude"
    assert npm_install_command() == [
        "npm",
        "install",
        "--prefix",
        str(prefix),
        "--no-audit",
        "--no-fund",
        "--no-update-notifier",
        "--loglevel=error",
        "--prefer-offline",
        f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}",
    ]


def test_the_version_is_pinned_in_one_place() -> None:
    from e2e import claude_cli

    assert claude_cli.CLAUDE_CODE_VERSION == CLAUDE_CODE_VERSION
    # The captured requests the tests replay come from that very release.
    assert (REPO / "tests" / "fixtures" / f"claude-code-{CLAUDE_CODE_VERSION}").is_dir()
    makefile = (REPO / "Makefile").read_text()
    assert CLAUDE_CODE_VERSION not in makefile and "npm install" not in makefile
    assert "mlx launch claude --install-claude" in makefile


# --- installing, with consent ---------------------------------------------------------------


def _never_asked(question: str) -> bool:
    raise AssertionError(f"asked: {question}")


def test_without_a_terminal_it_fails_with_the_install_command(tmp_path: Path) -> None:
    npm_dir = tmp_path / "bin"
    _fake_npm(npm_dir)
    with pytest.raises(ClaudeNotFound) as raised:
        find_or_install(path=str(npm_dir), prefix=tmp_path / "pinned", confirm=None)
    assert "--install-claude" in (raised.value.hint or "")
    assert _npm_args(npm_dir) is None  # nothing was installed


def test_declining_installs_nothing_and_the_question_says_what_and_where(
    tmp_path: Path,
) -> None:
    npm_dir, prefix = tmp_path / "bin", tmp_path / "pinned"
    _fake_npm(npm_dir)
    asked: list[str] = []

    def decline(question: str) -> bool:
        asked.append(question)
        return False

    with pytest.raises(ClaudeNotFound):
        find_or_install(path=str(npm_dir), prefix=prefix, confirm=decline)
    [question] = asked
    assert f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}" in question
    assert str(prefix) in question and "npm install --prefix" in question
    assert question == install_question(prefix)
    assert _npm_args(npm_dir) is None


def test_agreeing_runs_the_pinned_npm_install_and_returns_its_claude(tmp_path: Path) -> None:
    npm_dir, prefix = tmp_path / "bin", tmp_path / "pinned"
    _fake_npm(npm_dir)
    said: list[str] = []
    found = find_or_install(
        path=str(npm_dir), prefix=prefix, confirm=lambda q: True, say=said.append
    )
    assert found == pinned_claude(prefix)
    assert _npm_args(npm_dir) == npm_install_command(prefix)[1:]
    assert any("installing Claude Code" in line for line in said)
    assert any("Node.js is not on PATH" in line for line in said)  # warned, not refused
    # Found from now on, without asking.
    assert find_or_install(path=str(npm_dir), prefix=prefix, confirm=_never_asked) == found


def test_the_flag_installs_without_asking(tmp_path: Path) -> None:
    npm_dir, prefix = tmp_path / "bin", tmp_path / "pinned"
    _fake_npm(npm_dir)
    found = find_or_install(
        path=str(npm_dir), prefix=prefix, install=True, confirm=_never_asked, say=lambda m: None
    )
    assert found == pinned_claude(prefix)


def test_a_wrong_claude_bin_is_an_error_even_with_the_flag(tmp_path: Path) -> None:
    npm_dir = tmp_path / "bin"
    _fake_npm(npm_dir)
    with pytest.raises(ClaudeNotFound):
        find_or_install(
            str(tmp_path / "typo" / "claude"), install=True, path=str(npm_dir), prefix=tmp_path
        )
    assert _npm_args(npm_dir) is None


def test_no_npm_or_a_failing_npm_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ClaudeInstallFailed, match="npm is not on PATH") as raised:
        install_claude_code(tmp_path / "pinned", path=str(tmp_path / "empty"))
    assert "Node.js 22" in (raised.value.hint or "")
    failing = tmp_path / "npm-fail"
    _fake_npm(failing)
    with pytest.raises(ClaudeInstallFailed, match="exited with 1"):
        install_claude_code(tmp_path / "pinned", path=str(failing))


# --- Node.js ----------------------------------------------------------------------------------


def test_node_versions_are_read_and_judged(tmp_path: Path) -> None:
    assert NODE_REQUIRED == (22, 0, 0)  # `npm view @anthropic-ai/claude-code@2.1.332 engines`
    assert parse_node_version("v20.20.2\n") == (20, 20, 2)
    assert parse_node_version("not a version") is None
    assert node_problem(NodeFacts("/usr/bin/node", (22, 3, 0))) is None
    old = node_problem(NodeFacts("/usr/bin/node", (20, 20, 2)))
    assert old is not None and "20.20.2" in old and ">= 22.0.0" in old
    missing = node_problem(NodeFacts(None, None))
    assert missing is not None and "not on PATH" in missing
    _executable(tmp_path / "bin" / "node", "#!/bin/sh\necho v18.19.0\n")
    facts = node_facts(str(tmp_path / "bin"))
    assert facts == NodeFacts(str(tmp_path / "bin" / "node"), (18, 19, 0)) and facts.too_old
    assert node_facts(str(tmp_path / "empty")) == NodeFacts(None, None)


def test_only_a_node_script_claude_runs_under_node(tmp_path: Path) -> None:
    script = _executable(tmp_path / "cli.js", "#!/usr/bin/env node\nconsole.log(1)\n")
    assert runs_under_node(script)
    assert not runs_under_node(_fake_claude(tmp_path / "claude"))
    assert not runs_under_node(Path(sys.executable))  # a native binary
    assert not runs_under_node(tmp_path / "missing")


# --- launches claude could not run ------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "stdin_tty", "stdout_tty", "refused"),
    [
        ([], True, True, False),  # a terminal: the interactive screen
        ([], False, False, False),  # both piped: print mode, the prompt from stdin
        ([], True, False, True),  # `make run | tee log`
        (["--verbose"], True, False, True),
        (["-p", "hello"], True, False, False),
        (["--print", "hello"], True, False, False),
        (["explain this"], True, False, False),  # a prompt (print mode) or a subcommand
        (["--version"], True, False, False),
        ([], False, True, True),  # `… < file` on a terminal: claude could not read keys
        (["explain this"], False, True, True),
        (["-p", "hello"], False, True, False),
    ],
)
def test_claude_is_refused_only_when_it_could_not_run(
    args: list[str], stdin_tty: bool, stdout_tty: bool, refused: bool
) -> None:
    if not refused:
        check_claude_can_start(args, stdin_tty=stdin_tty, stdout_tty=stdout_tty)
        return
    with pytest.raises(NoTerminalForClaude) as raised:
        check_claude_can_start(args, stdin_tty=stdin_tty, stdout_tty=stdout_tty)
    assert raised.value.exit_code == 2
    assert '-- -p "your prompt"' in (raised.value.hint or "")
