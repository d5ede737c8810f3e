"""What `mlx serve` and `mlx launch <agent>` were asked to do: typed records, parsed once.

`ServeOptions` and `LaunchOptions` are each command's own; both hold an `EngineOptions`.

`EngineOptions` is what the user wrote (a field per option, its default the CLI's); it becomes
`EngineConfig` keyword arguments here (`config_arguments`), and travels to every rank of a
cluster as it is (`as_json` / `from_json`, inside the rank spec). The CLI declares each field's
option once (cli/engine_options.py), and a test checks that every field has one. Free of MLX
imports: the CLI and a cluster rank read it before anything loads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxlaunch.cluster.hosts import Cluster
from mlxlaunch.engine.settings import DEFAULT_CACHE_DISK, cache_config, engine_tuning
from mlxlaunch.errors import ConfigError


@dataclass(frozen=True)
class EngineOptions:
    """The engine options both commands take, as the user wrote them (None: the default)."""

    context_length: int | None = None
    max_concurrency: int | None = None
    idle_clear: str | None = "30s"  # clear MLX's buffer cache after this long idle
    keep_alive: str | None = None  # unload the model after this long idle (None: never)
    memory_fraction: float | None = 0.85  # MLX's memory limit, as a share of RAM
    cache_memory: str = "auto"  # prefix cache: memory budget, saved-prefix dir, disk budget
    cache_dir: Path | None = None
    cache_disk: str = DEFAULT_CACHE_DISK
    tool_format: str | None = None
    render: str = "stable"  # prompt rendering: "stable" or "exact" (EngineConfig.render)
    speculate: str = "auto"  # speculative decoding (EngineConfig.speculate)
    draft_model: str | None = None  # its draft model, by name (resolved when serving)
    kv_bits: int | None = None  # KV caches quantized to 8 or 4 bits (EngineConfig.kv_bits)
    kv_group_size: int | None = None  # values per quantization group (EngineConfig)
    debug_cache: bool = False  # keep prompt text around cache misses (EngineConfig.debug_cache)
    safeguards: bool = True  # answer Claude Code's auto-mode check (ServerSettings.safeguards)

    def config_arguments(self) -> dict[str, Any]:
        """EngineConfig keyword arguments for everything but the model and its logits hook.

        Raises:
            ConfigError: a keep-alive or idle-clear that is not a duration (the CLI checks its
                own options; the user's settings file can still hold one), or `--speculate
                draft` without a draft model.
        """
        if self.speculate == "draft" and not self.draft_model:
            raise ConfigError(
                "--speculate draft needs a draft model",
                hint="add --draft-model M (a small model with the same tokenizer), or serve "
                "one beside the main model with --small-model M: it drafts too",
            )
        return {
            "context_length": self.context_length,
            "tool_format": self.tool_format,
            "render": self.render,
            "speculate": self.speculate,
            "debug_cache": self.debug_cache,
            "kv_bits": self.kv_bits,
            "kv_group_size": self.kv_group_size,
            **engine_tuning(
                max_concurrency=self.max_concurrency,
                idle_clear=self.idle_clear,
                keep_alive=self.keep_alive,
                memory_fraction=self.memory_fraction,
            ),
            **cache_config(self.cache_memory, self.cache_dir, self.cache_disk),
        }

    def check_for_cluster(self) -> None:
        """Refuse what the ranks of a cluster cannot honour.

        Raises:
            ConfigError: an explicit drafter (the ranks decode in lockstep, one token a step).
        """
        if self.speculate in ("lookup", "draft"):
            raise ConfigError(
                f"--speculate {self.speculate} cannot be used with --hosts: the ranks decode "
                "in lockstep, one token per step",
                hint="leave --speculate at auto (off on a cluster) or use one machine",
            )

    def as_json(self) -> dict[str, Any]:
        """The fields as JSON values (a path as its text), for the rank spec."""
        return {
            name: str(value) if isinstance(value, Path) else value
            for name, value in dataclasses.asdict(self).items()
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EngineOptions:
        """The options `as_json` wrote (the same mlxlaunch runs on every rank)."""
        fields = dict(data)
        if fields.get("cache_dir") is not None:
            fields["cache_dir"] = Path(fields["cache_dir"])
        return cls(**fields)


@dataclass(frozen=True)
class ServeOptions:
    """What `mlx serve` was asked to do (CLI options, already parsed)."""

    model: str
    also: Sequence[str] = ()  # more models served beside it (launch/serving.py)
    small_model: str | None = None  # Claude Code's haiku tier, served beside it
    host: str = "127.0.0.1"
    port: int = 8080
    auth_token: str | None = None  # None: a fresh random token, unless no_auth
    no_auth: bool = False
    allow_remote: bool = False
    allowed_origins: Sequence[str] = ()
    preload: bool = True
    engine: EngineOptions = field(default_factory=EngineOptions)
    cluster: Cluster | None = None  # several machines (launch/cluster_serve.py); None: this one


@dataclass
class LaunchOptions:
    """What `mlx launch <agent>` was asked to do (CLI options, already validated)."""

    model: str | None = None  # None: the default-model setting, else the best local model
    small_model: str | None = None  # None here and below: the user's setting, else automatic
    port: int | None = None
    engine: EngineOptions = field(default_factory=EngineOptions)
    max_output_tokens: int | None = None
    preload: bool = False
    agent_bin: str | None = None  # the executable to run (None: looked up as usual)
    agent_args: Sequence[str] = ()
    extra_env: Mapping[str, str] = field(default_factory=dict)
    verbose: bool = False
    cluster: Cluster | None = None  # serve from several machines (launch/cluster_serve.py)
