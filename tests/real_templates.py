"""Test models built with REAL chat templates (tests/fixtures/chat-templates/), served, and
scripted to write what each family writes — derived from the fixture files, never from a list
of family names. Shared by the real-family and the prefix-cache tests."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from engine_helpers import Served, messages_tool, serve
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.tokenizer_utils import load as load_tokenizer

from mlxlaunch.testing.builder import BPE_VOCAB_SIZE, CONTEXT_WINDOW, build_model
from mlxlaunch.testing.templates import TemplateFamily, real_template_family
from mlxlaunch.testing.tokenizer import write_tokenizer

FIXTURES = Path(__file__).parent / "fixtures"
TEMPLATES = sorted((FIXTURES / "chat-templates").glob("*.jinja"))
CAPTURED = ("print-mode-request", "tool-result-request", "title-request")
BASH_TOOL = messages_tool(
    "Bash",
    "Run a shell command",
    {"command": {"type": "string"}, "description": {"type": "string"}},
    required=["command"],
)
ANSWER = "The listing shows two files."
HEADERS = {"x-api-key": "x", "anthropic-version": "2023-06-01"}
COUNTED_FIELDS = ("model", "messages", "system", "tools", "thinking", "tool_choice")


def captured(name: str) -> dict[str, Any]:
    body = json.loads((FIXTURES / "claude-code-2.1.332" / f"{name}.json").read_text())["body"]
    return dict(body)


@dataclass(kw_only=True)
class FamilyModel(Served):
    """A served tiny model with a real template (`family`) and that template's tokens."""

    family: TemplateFamily
    facts: dict[str, Any]

    def markup(self) -> list[str]:
        """Every special or markup token of the family: none may reach visible text."""
        return [
            t
            for t in self.facts["special_tokens"] + self.facts["added_tokens_not_special"]
            if len(t) > 1
        ]


@contextlib.contextmanager
def served_family(template: Path, directory: Path, **engine: Any) -> Iterator[FamilyModel]:
    """A tiny model with `template`'s real chat template and tokens, served with a script."""
    family = real_template_family(template)
    facts = json.loads(template.with_suffix(".tokens.json").read_text())
    model_dir = directory / family.name
    if not (model_dir / "config.json").exists():
        build_model(model_dir, "tiny", template=family)
    options: dict[str, Any] = {"max_concurrency": 2, **engine}
    with serve(model_dir, **options) as s:
        yield FamilyModel(
            s.engine, s.server, s.scripted, None, model_dir, family=family, facts=facts
        )


def model_output_of_call(model: FamilyModel) -> tuple[str, str]:
    """(what the model writes for the fixture's tool call, the token that ends its turn).

    The fixture gives the text the template adds to a conversation for an assistant turn with
    the call; the model writes that text minus what the generation prompt already holds."""
    tokenizer = model.tokenizer
    call = model.facts["tool_call"]
    user = [{"role": "user", "content": "List the source files."}]
    tools = [
        {
            "type": "function",
            "function": {
                "name": BASH_TOOL["name"],
                "description": BASH_TOOL["description"],
                "parameters": BASH_TOOL["input_schema"],
            },
        }
    ]
    before = tokenizer.apply_chat_template(user, tools=tools, tokenize=False)
    prompt = tokenizer.apply_chat_template(
        user, tools=tools, tokenize=False, add_generation_prompt=True
    )
    full = before + call["assistant_turn_as_rendered"]
    shared = 0
    while shared < min(len(full), len(prompt)) and full[shared] == prompt[shared]:
        shared += 1
    assert shared >= len(before) - 16, "the generation prompt does not continue the history"
    written = full[shared:]
    end = call["turn_ends_with"]
    cut = written.find(end)
    return (written[:cut] if cut >= 0 else written), end


def script_call(model: FamilyModel, split: bool) -> None:
    text, end = model_output_of_call(model)
    tokenizer = model.tokenizer
    if split:  # every marker that is not a single token arrives in pieces
        ids: list[int] = []
        for piece in _pieces(text, model.markup()):
            ids += tokenizer.encode(piece, add_special_tokens=False)
    else:
        ids = tokenizer.encode(text, add_special_tokens=False)
    end_ids = tokenizer.encode(end, add_special_tokens=False)
    model.scripted.enqueue(tokens=[*ids, *end_ids])


def answer_script(model: FamilyModel) -> str:
    """ANSWER as the model writes it: after closing the think span, when the generation
    prompt opens one (MiniMax-M2 always thinks)."""
    markers = model.facts["think_markers"]
    prompt = model.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    if markers and prompt.rfind(markers[0]) > prompt.rfind(markers[1]):
        return f"{markers[1]}\n\n{ANSWER}"
    return ANSWER


def _pieces(text: str, tokens: list[str]) -> list[str]:
    """`text` as added tokens whole and everything else one character at a time."""
    out: list[str] = []
    i = 0
    ordered = sorted(tokens, key=len, reverse=True)
    while i < len(text):
        token = next((t for t in ordered if text.startswith(t, i)), None)
        if token is not None:
            out.append(token)
            i += len(token)
        else:
            out.append(text[i])
            i += 1
    return out


def post(model: FamilyModel, path: str, body: dict[str, Any]) -> httpx.Response:
    """The body as Claude Code sent it (the SDK refuses its newer fields)."""
    return httpx.post(model.server.url + path, json=body, headers=HEADERS, timeout=300)


REASONING = "The user wants the files listed, so I run ls."


def scripted_reasoning_and_call(model: FamilyModel) -> str | None:
    """Reasoning then the fixture's call, written as this family writes them: as its template
    renders an assistant turn with reasoning (under whichever key it reads), else between the
    fixture's think markers; None for a family with neither."""
    tokenizer = model.tokenizer
    example = model.facts["tool_call"]["example"]
    call = {
        "id": example["id"],
        "type": "function",
        "function": {"name": example["name"], "arguments": example["arguments"]},
    }
    user = [{"role": "user", "content": "List the source files."}]
    turn = {
        "role": "assistant",
        "content": "",
        "reasoning_content": REASONING,
        "thinking": REASONING,
        "tool_calls": [call],
    }
    try:
        full = tokenizer.apply_chat_template([*user, turn], tokenize=False)
    except Exception:
        full = ""
    prompt = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    shared = 0
    while shared < min(len(full), len(prompt)) and full[shared] == prompt[shared]:
        shared += 1
    written = full[shared:]
    end = written.find(model.facts["tool_call"]["turn_ends_with"])
    written = written[:end] if end >= 0 else written
    if REASONING in written:
        return written
    markers = model.facts["think_markers"]
    if markers:
        call_text, _ = model_output_of_call(model)
        return f"{markers[0]}{REASONING}{markers[1]}{call_text}"
    return None


def tokenizer_builder(root: Path) -> Callable[[str], TokenizerWrapper]:
    """Tokenizers (no weights: cheap) built with each fixture family's real template and
    tokens under `root`, by family name, each built once."""
    built: dict[str, TokenizerWrapper] = {}

    def get(family: str) -> TokenizerWrapper:
        if family not in built:
            directory = root / family
            directory.mkdir()
            template = real_template_family(FIXTURES / "chat-templates" / f"{family}.jinja")
            write_tokenizer(directory, template, BPE_VOCAB_SIZE, CONTEXT_WINDOW)
            built[family] = load_tokenizer(directory)
        return built[family]

    return get
