"""Where the server's log goes: one line per request to the terminal (`mlx serve`), or off the
terminal that `claude` owns (`mlx launch claude`).

For `mlx launch claude`, two layers: Python logging (our server, uvicorn, warnings) goes to the
log file for the whole launch; and while the child runs, this process's own stdout/stderr file
descriptors point at the log file too, so even C-level output (MLX, tokenizers) cannot draw
over Claude Code's screen. The child gets the original descriptors.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from mlxlaunch.home import private_dir
from mlxlaunch.launch.child import Stdio
from mlxlaunch.launch.state import logs_dir

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
REQUEST_LOG_FORMAT = "%(asctime)s %(message)s"
# Control characters (C0, DEL, C1) and line breaks in a message: shown escaped.
_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), *range(0x7F, 0xA0)]}
_CONTROL.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})
# The longest message a line shows at INFO and above (debug lines carry whole prompts, on
# purpose): the backstop for client-chosen text a call site did not shorten itself.
MAX_MESSAGE_CHARS = 8_000


class PlainTextFormatter(logging.Formatter):
    """A formatter whose messages cannot drive the terminal or forge log lines.

    Log messages quote what clients sent (a model name, a refused field's value, a path); an
    escape sequence there would reach the operator's terminal, a line break would start a
    line that looks like the server's own; and one request's 22 MB `type` made a 22 MB line,
    so a message at INFO or above is cut at MAX_MESSAGE_CHARS. Tracebacks, added after the
    message, stay as they are."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        message = record.message
        if record.levelno >= logging.INFO and len(message) > MAX_MESSAGE_CHARS:
            message = f"{message[:MAX_MESSAGE_CHARS]}…({len(message)} chars)"
        record.message = message.translate(_CONTROL)
        return super().formatMessage(record)


def new_log_path(home: Path | None = None, pid: int | None = None) -> Path:
    """A fresh log file path, e.g. `<home>/logs/launch-20261129-201500-4242.log`."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    directory = logs_dir(home)
    private_dir(directory)  # and the home: 0700 whatever the umask
    path = directory / f"launch-{stamp}-{pid or os.getpid()}.log"
    # Prompts end up in the log at debug level: keep it private from the start.
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    return path


@contextlib.contextmanager
def logging_to(path: Path, level: int = logging.INFO) -> Iterator[None]:
    """Send all Python logging (and warnings) to `path` instead of the terminal."""
    root = logging.getLogger()
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(PlainTextFormatter(LOG_FORMAT))
    previous_handlers, previous_level = root.handlers[:], root.level
    root.handlers = [handler]
    root.setLevel(min(level, previous_level or level))  # keep --debug's lower level
    logging.captureWarnings(True)
    try:
        yield
    finally:
        logging.captureWarnings(False)
        root.handlers = previous_handlers
        root.setLevel(previous_level)
        handler.close()


@contextlib.contextmanager
def terminal_to_child(path: Path) -> Iterator[Stdio]:
    """Point our fds 1 and 2 at `path`; yield the original ones for the child to use."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    log_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        yield Stdio(stdin=None, stdout=saved_out, stderr=saved_err)
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        for fd in (saved_out, saved_err, log_fd):
            os.close(fd)


def log_requests_to_terminal() -> None:
    """One line per request from the server's logger on stderr, unless logging is set up."""
    server_log = logging.getLogger("mlxlaunch.server")
    if server_log.level == logging.NOTSET:
        server_log.setLevel(logging.INFO)
    if not logging.getLogger().handlers and not server_log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(PlainTextFormatter(REQUEST_LOG_FORMAT, datefmt="%H:%M:%S"))
        server_log.addHandler(handler)
