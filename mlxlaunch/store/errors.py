"""The store's typed errors: each carries what went wrong as data, in no command's words.

What a user should run next (`mlx models pull …`, `--force`) is the CLI's to say: its one
table (cli/error_text.py) turns each of these into a message and a hint. The message here is
a plain sentence for logs and other callers; it names no command or flag.
"""

from __future__ import annotations

from mlxlaunch.errors import ConfigError, MlxLaunchError, ModelLoadError, ModelNotFound


class ModelNotDownloaded(ModelNotFound):
    """A catalog alias or repo id with nothing (or only part) in the hub cache."""

    def __init__(self, name: str, *, partly: bool = False) -> None:
        state = "only partly downloaded" if partly else "not downloaded"
        super().__init__(f"model '{name}' is {state}")
        self.name, self.partly = name, partly


class UnknownModel(ModelNotFound):
    """A name that is no path, registered name, catalog alias nor repo id."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown model '{name}'")
        self.name = name


class NotAHubName(ModelNotFound):
    """A name to pull that is neither a catalog alias nor an `org/name` repo id."""

    def __init__(self, name: str) -> None:
        super().__init__(f"'{name}' is neither a catalog alias nor a hub repo id (org/name)")
        self.name = name


class NoSuchRevision(ModelNotFound):
    """The hub repo exists but not at the revision asked for."""

    def __init__(self, repo_id: str) -> None:
        super().__init__(f"'{repo_id}' has no such revision")
        self.repo_id = repo_id


class NotLocal(ModelNotFound):
    """A model to remove that is not on this machine."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no local model '{name}'")
        self.name = name


class ModelInUse(MlxLaunchError):
    """A running server has the model loaded; removing it would pull files from under it."""

    exit_code = 7

    def __init__(self, name: str, url: str, pid: int) -> None:
        super().__init__(f"'{name}' is loaded by a running server ({url}, pid {pid})")
        self.name, self.url, self.pid = name, url, pid


class NotAnMlxModel(ModelLoadError):
    """A hub repo MLX cannot load (no safetensors, unknown architecture, no tokenizer)."""

    def __init__(self, repo_id: str, problems: list[str] | tuple[str, ...]) -> None:
        super().__init__(f"'{repo_id}' is not a model MLX can load: " + "; ".join(problems))
        self.repo_id, self.problems = repo_id, tuple(problems)


class BadShardSpec(ConfigError):
    """A shard that is not RANK/SIZE (`size` None), or names a rank outside 0..size-1."""

    def __init__(self, text: str, size: int | None = None) -> None:
        why = "expected RANK/SIZE" if size is None else f"ranks run from 0 to {size - 1}"
        super().__init__(f"shard {text!r}: {why}")
        self.text, self.size = text, size
