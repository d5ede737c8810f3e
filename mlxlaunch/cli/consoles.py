"""The rich consoles every command prints through: the terminal's width on a terminal, and no
hard wrapping anywhere else.

Rich lays out for 80 columns when its stream is not a terminal, so a log, a pipe or CI got
paths and commands split across lines where nobody can copy them whole. Without a terminal
(and without `COLUMNS`, which always wins) these consoles wrap nothing: text is printed as
it is and a table takes the width it needs.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, ConsoleDimensions

# The width a console without a terminal lays tables out in: wider than any table it prints.
UNWRAPPED_WIDTH = 1000


class CliConsole(Console):
    """A rich Console that wraps nothing when its stream is not a terminal (see module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._soft_wrap_asked = False
        super().__init__(*args, **kwargs)
        if kwargs.get("width") is None:
            # Rich fixes the width from COLUMNS at construction; read it when printing instead,
            # so a console made at import follows the environment it prints in.
            self._width = None

    def unwrapped(self) -> bool:
        """True when this console prints to a non-terminal and no width was set or asked for."""
        return self._width is None and not self.is_terminal and "COLUMNS" not in self._environ

    @property
    def size(self) -> ConsoleDimensions:
        """The console's size: `UNWRAPPED_WIDTH` wide when `unwrapped()`."""
        size = super().size
        return ConsoleDimensions(UNWRAPPED_WIDTH, size.height) if self.unwrapped() else size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size

    @property
    def soft_wrap(self) -> bool:
        """Rich's soft wrap (text is never folded), always on when `unwrapped()`."""
        return self._soft_wrap_asked or self.unwrapped()

    @soft_wrap.setter
    def soft_wrap(self, value: bool) -> None:
        self._soft_wrap_asked = value


def stdout_console() -> CliConsole:
    """A console on standard output (reports, tables)."""
    return CliConsole()


def stderr_console() -> CliConsole:
    """A console on standard error (progress, notes, errors)."""
    return CliConsole(stderr=True)
