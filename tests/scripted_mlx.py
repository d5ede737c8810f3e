"""TEST-ONLY: the `mlx` command with scripted model output, for tests that run it as a process.

    python tests/scripted_mlx.py SCRIPT.json serve --model tiny --port 0

`SCRIPT.json` holds the replies, one per request in order (a bare list works too):

    {"outputs": ["plain text reply", {"text": "..."}, {"tokens": [12, 34]}]}

Once they are used up the model samples normally. Replies for requests that declare no tools
(a client's session-title request, say, whose timing against the main request is not fixed)
can be listed apart, under `"untooled"`: such a request takes those first. With `--hosts`, each
rank of the cluster runs this script too (`SCRIPT.json --cluster-rank`); rank 0 replies. The
product reads no test hook of its own: this script hands a `ScriptedOutput` to `cli.main.main`,
whose serving commands pass it on as the engine's logits hook (cli/app.py `Overrides`,
launch/serving.py).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlxlaunch.testing.scripted import ScriptedOutput

SCRIPT = Path(__file__).resolve()
CLUSTER_RANK = "--cluster-rank"


def scripted_mlx_command(script: Path) -> list[str]:
    """The command line that runs `mlx` with the replies in `script`; append its arguments."""
    return [sys.executable, str(SCRIPT), str(script)]


def write_script(path: Path, outputs: list[Any], untooled: list[Any] | None = None) -> Path:
    """Write `outputs` (texts, `{"text": …}` or `{"tokens": […]}`) as a script, with replies for
    requests without tools apart when `untooled` is given; returns `path`."""
    data: dict[str, Any] = {"outputs": outputs}
    if untooled:
        data["untooled"] = untooled
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


class RoutedOutput:
    """Two scripts: one for requests without tools (while it lasts), one for the rest."""

    def __init__(self, tooled: ScriptedOutput, untooled: ScriptedOutput) -> None:
        self.tooled = tooled
        self.untooled = untooled

    def __call__(self, request: Any, tokenizer: Any) -> Any:
        if not request.tools and self.untooled.pending:
            return self.untooled(request, tokenizer)
        return self.tooled(request, tokenizer)


def read_script(path: Path) -> ScriptedOutput | RoutedOutput:
    """The logits hook that replies with what `path` lists."""
    data: Any = json.loads(path.read_text(encoding="utf-8"))
    outputs = data.get("outputs", []) if isinstance(data, dict) else data
    scripted = _scripted(path, outputs)
    if isinstance(data, dict) and data.get("untooled"):
        return RoutedOutput(scripted, _scripted(path, data["untooled"]))
    return scripted


def _scripted(path: Path, outputs: list[Any]) -> ScriptedOutput:
    from mlxlaunch.testing.scripted import ScriptedOutput

    scripted = ScriptedOutput()
    for item in outputs:
        if isinstance(item, str):
            scripted.enqueue(text=item)
        elif isinstance(item, dict) and "tokens" in item:
            scripted.enqueue(tokens=[int(t) for t in item["tokens"]])
        elif isinstance(item, dict) and "text" in item:
            scripted.enqueue(text=str(item["text"]))
        else:
            raise ValueError(f"{path}: cannot read output {item!r}")
    return scripted


def main(argv: list[str]) -> int:
    """Run `mlx ARGS…` with the replies of `argv[0]`, as `mlx`'s own entry point would."""
    from mlxlaunch.blas import use_optimised_blas

    use_optimised_blas()  # before ScriptedOutput imports mlx, as `mlx` itself does
    from mlxlaunch.cli.app import Overrides
    from mlxlaunch.cli.main import main as mlx_main

    scripted = read_script(Path(argv[0]))
    if argv[1:] == [CLUSTER_RANK]:  # one rank of `serve --hosts`, started by mlx.launch
        from mlxlaunch.launch.cluster_rank import run_from_environment

        return run_from_environment(logits_hook=scripted)
    # A cluster's rank 0 is another process: mlx.launch starts this script there too.
    ranks = (str(SCRIPT), str(Path(argv[0]).resolve()), CLUSTER_RANK)
    return mlx_main(argv[1:], overrides=Overrides(logits_hook=scripted, rank_command=ranks))


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # As `mlx` does (cli/main.py `entry`): no interpreter teardown once MLX ran on a thread.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
