"""End to end: the real Codex CLI (pinned) editing a file through its freeform `apply_patch`.

Codex 0.171.0 offers `apply_patch` as a `custom` tool with its Lark grammar for the models it
knows (`codex debug models`: `apply_patch_tool_type` "freeform" for every one); the user here
names one (`-c model="gpt-5.5"`), which the server serves with its loaded model. (Its
`features.apply_patch_freeform` alone does not: with the fallback metadata of a model it does
not know, Codex offers no apply_patch tool at all.) The scripted model
calls the tool with a patch that adds a file; the server answers with a `custom_tool_call`
whose input is the raw patch (the call generated under the tool's grammar), Codex applies it,
and sends the result back as a `custom_tool_call_output`, which the next turn renders.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e.launching import git_work, launch_argv, launch_env, run_launch
from scripted_mlx import scripted_mlx_command, write_script

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PATCH = '*** Begin Patch\n*** Add File: proof.txt\n+patched by "apply_patch"\n*** End Patch\n'


def test_codex_edits_a_file_through_freeform_apply_patch(
    tmp_path: Path, real_codex: Path, small_model_dir: Path
) -> None:
    work = git_work(tmp_path)
    call = {"name": "apply_patch", "arguments": {"input": PATCH}}
    tool_turn = f"</think>\n\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
    final = "The file is patched."
    script = write_script(tmp_path / "script.json", [tool_turn] + [f"</think>\n\n{final}"] * 3)
    words = ["exec", "-c", 'model="gpt-5.5"', "add proof.txt"]
    argv = launch_argv(scripted_mlx_command(script), "codex", small_model_dir, real_codex, words)
    done, log = run_launch(argv, work, launch_env(tmp_path), timeout=420)
    assert done.returncode == 0, done.stdout + done.stderr + log
    proof = work / "proof.txt"
    assert proof.exists(), done.stdout + done.stderr + log
    assert proof.read_text() == 'patched by "apply_patch"\n', done.stderr + log
    assert final in done.stdout + done.stderr
    # Codex's own record of the session: the call it got was a freeform one, its output too.
    rollouts = list((tmp_path / "mlx" / "agents" / "codex" / "sessions").rglob("*.jsonl"))
    items = [json.loads(line) for path in rollouts for line in path.read_text().splitlines()]
    kinds = {item.get("payload", {}).get("type") for item in items}
    assert {"custom_tool_call", "custom_tool_call_output"} <= kinds, kinds
    [call_item] = [
        i["payload"] for i in items if i.get("payload", {}).get("type") == "custom_tool_call"
    ]
    assert call_item["name"] == "apply_patch" and call_item["input"] == PATCH
