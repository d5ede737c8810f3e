"""Refusing a launch that Claude Code cannot run: half of the terminal piped away, no -p.

Claude Code runs its interactive screen only when stdout is a terminal; otherwise it switches
to print mode and needs a prompt, as an argument or on a piped stdin. `make run | tee log`
gives it neither (stdin is still the keyboard), and it exits with "Input must be provided …
when using --print" — after the model was loaded. The other half: with stdin piped but stdout
a terminal, the launcher cannot hand the terminal to claude, whose reads of /dev/tty then stop
it (SIGTTIN). Both streams piped is fine: print mode, the prompt read from stdin.
"""

from __future__ import annotations

from collections.abc import Sequence

from mlxlaunch.errors import ConfigError

# Arguments with which claude does not need the interactive screen.
_PRINT_FLAGS = frozenset({"-p", "--print"})
_INFO_FLAGS = frozenset({"-v", "--version", "-h", "--help"})

_HINT = (
    "run it in a terminal, without `| tee`, `>` or `<` (the server log is written to a file "
    'anyway), or give claude a prompt: mlx launch claude -- -p "your prompt"'
)


class NoTerminalForClaude(ConfigError):
    """One of stdin and stdout is a terminal and the other is not, and claude has no -p."""


def check_claude_can_start(
    claude_args: Sequence[str], *, stdin_tty: bool, stdout_tty: bool
) -> None:
    """Raise NoTerminalForClaude when claude would stop at once (or be stopped) as started.

    Nothing to check when both streams are terminals, both are piped, or claude got `-p`.
    """
    if stdin_tty == stdout_tty or any(a in _PRINT_FLAGS | _INFO_FLAGS for a in claude_args):
        return
    if not stdout_tty:
        # A bare word is a prompt (`claude "fix it"`) or a subcommand (`claude mcp list`):
        # print mode has something to do, so claude decides, not us.
        if any(not arg.startswith("-") for arg in claude_args):
            return
        raise NoTerminalForClaude(
            "the output of `mlx launch claude` is not a terminal (piped or redirected), so "
            "Claude Code would start in print mode with no prompt and stop at once",
            hint=_HINT,
        )
    raise NoTerminalForClaude(
        "the input of `mlx launch claude` is not a terminal (piped or redirected), so Claude "
        "Code could not read the keyboard",
        hint=_HINT,
    )
