"""Offline test models: real mlx-lm loading, tokenizer, chat template, scripted output."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from mlx_lm.generate import BatchGenerator
from mlx_lm.tokenizer_utils import TokenizerWrapper
from tokenizers import AddedToken, Tokenizer
from transformers import AutoTokenizer

from mlxlaunch.store.verify import check_weights
from mlxlaunch.testing import (
    DEMO_NOTICE,
    TEMPLATE_FAMILIES,
    ForwardFailures,
    ScriptedOutput,
    build_model,
    ensure_test_model,
    fail_forward,
    is_test_model_name,
)
from mlxlaunch.testing.templates import template_family
from mlxlaunch.testing.tokenizer import _learned_bpe, train_tokenizer

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> tuple[Any, TokenizerWrapper]:
    loaded = mlx_lm.load(str(tiny_model_dir))
    return loaded[0], loaded[1]


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def render(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    assert isinstance(text, str)
    return text


# --- the model directory ------------------------------------------------------------------


def test_config_declares_context_window_and_eos(tiny_model_dir: Path, tiny: Any) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    _, tokenizer = tiny
    assert config["model_type"] == "qwen3"
    assert config["max_position_embeddings"] == 40960
    assert config["tie_word_embeddings"] is True
    assert config["eos_token_id"] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token_ids == {config["eos_token_id"]}


def test_loaded_model_generates_tokens(tiny: Any) -> None:
    model, tokenizer = tiny
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    responses = list(mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=5))
    assert 1 <= len(responses) <= 5
    assert all(0 <= r.token < len(tokenizer.get_vocab()) for r in responses)


def embeddings(model_dir: Path) -> mx.array:
    weights = mx.load(str(model_dir / "model.safetensors"))
    assert isinstance(weights, dict)
    return weights["model.embed_tokens.weight"]


def test_same_seed_builds_identical_weights(tmp_path: Path) -> None:
    a = build_model(tmp_path / "a", "tiny", seed=3)
    b = build_model(tmp_path / "b", "tiny", seed=3)
    c = build_model(tmp_path / "c", "tiny", seed=4)
    embed_a, embed_b, embed_c = (embeddings(p) for p in (a, b, c))
    assert mx.array_equal(embed_a, embed_b)
    assert not mx.array_equal(embed_a, embed_c)
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()


def test_weights_index_maps_every_tensor_to_the_weights_file(tiny_model_dir: Path) -> None:
    # Pipeline loading (mlx-lm's sharded_load) picks each rank's files from this index.
    index = json.loads((tiny_model_dir / "model.safetensors.index.json").read_text())
    weights = mx.load(str(tiny_model_dir / "model.safetensors"))
    assert isinstance(weights, dict)
    assert set(index["weight_map"]) == set(weights)
    assert set(index["weight_map"].values()) == {"model.safetensors"}
    assert index["metadata"]["total_size"] == sum(w.nbytes for w in weights.values())
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert check_weights(tiny_model_dir, config)[0] == []  # the store's own verifier agrees


@pytest.fixture(scope="module")
def tiny_moe_dir() -> Path:
    return ensure_test_model("tiny-moe")


def test_tiny_moe_model_is_a_shardable_qwen3_moe(tiny_moe_dir: Path, tiny_model_dir: Path) -> None:
    config = json.loads((tiny_moe_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3_moe"
    assert (config["num_experts"], config["num_experts_per_tok"]) == (4, 2)
    # Tensor parallelism on 2 ranks splits the heads; pipelining on 3 needs a layer each.
    assert config["num_attention_heads"] % 2 == 0 and config["num_key_value_heads"] % 2 == 0
    assert config["num_hidden_layers"] >= 3
    # The same trained tokenizer and template as the dense models.
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tiny_moe_dir / name).read_bytes() == (tiny_model_dir / name).read_bytes()
    index = json.loads((tiny_moe_dir / "model.safetensors.index.json").read_text())
    assert "model.layers.3.mlp.switch_mlp.gate_proj.weight" in index["weight_map"]

    model, tokenizer = mlx_lm.load(str(tiny_moe_dir))[:2]
    assert hasattr(model, "shard") and hasattr(model.model, "pipeline")
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    tokens = [r.token for r in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=8)]
    assert len(tokens) == 8 and len(set(tokens)) > 1  # the experts steer greedy output


def test_unknown_size_and_template_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="huge"):
        build_model(tmp_path, "huge")
    with pytest.raises(KeyError, match="klingon"):
        build_model(tmp_path, "tiny", template="klingon")


# --- tokenizer ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["plain ascii", "Grüße 日本語 🙂👍🏽 ≤→", "def f(x):\n\treturn x  # ü\n", "\u00a0\u200b\ufeff"],
)
def test_tokenizer_round_trips_text(hf_tokenizer: Any, text: str) -> None:
    ids = hf_tokenizer.encode(text, add_special_tokens=False)
    assert hf_tokenizer.decode(ids) == text


@settings(max_examples=examples(60), deadline=None)
@given(text=st.text(max_size=40))
def test_tokenizer_round_trips_any_unicode(hf_tokenizer: Any, text: str) -> None:
    ids = hf_tokenizer.encode(text, add_special_tokens=False)
    assert hf_tokenizer.decode(ids) == text


def test_markup_tokens_are_single_ids_kept_in_decoded_text(hf_tokenizer: Any) -> None:
    for token in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>"):
        ids = hf_tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1
        assert hf_tokenizer.decode(ids, skip_special_tokens=True) == token
    end = hf_tokenizer.encode("<|im_end|>", add_special_tokens=False)
    assert len(end) == 1
    assert hf_tokenizer.decode(end, skip_special_tokens=True) == ""


def test_claude_code_prompt_encodes_to_few_tokens(hf_tokenizer: Any, fixtures_dir: Path) -> None:
    body = json.loads((fixtures_dir / "print-mode-request.json").read_text())["body"]
    system = "".join(block["text"] for block in body["system"])
    tools = [
        {"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}}
        for t in body["tools"]
    ]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "say hi"}]
    text = render(hf_tokenizer, messages, tools=tools, add_generation_prompt=True)
    ids = hf_tokenizer.encode(text, add_special_tokens=False)
    # A trained BPE packs this English-and-JSON prompt at several characters per token
    # (about 3.9 with the bundled corpus); byte-level fallback alone would give 1.
    assert len(text) / len(ids) > 3.0


# --- chat template --------------------------------------------------------------------------


def test_template_renders_tools_as_json_in_system_turn(hf_tokenizer: Any) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = render(hf_tokenizer, messages, tools=TOOLS, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    tools_block = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert json.loads(tools_block) == TOOLS[0]
    assert text.count("<|im_start|>system") == 1


def test_template_renders_tool_calls_and_grouped_tool_results(hf_tokenizer: Any) -> None:
    call = {"type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": "", "tool_calls": [call, call]},
        {"role": "tool", "content": "a.txt"},
        {"role": "tool", "content": "b.txt"},
    ]
    text = render(hf_tokenizer, messages, tools=TOOLS)
    one_call = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>'
    assert f"</think>\n\n{one_call}\n{one_call}<|im_end|>\n" in text
    assert text.endswith(
        "<|im_start|>user\n<tool_response>\na.txt\n</tool_response>\n"
        "<tool_response>\nb.txt\n</tool_response><|im_end|>\n"
    )


def test_template_accepts_arguments_as_json_string(hf_tokenizer: Any) -> None:
    call = {"function": {"name": "Bash", "arguments": '{"command": "pwd"}'}}
    messages = [{"role": "assistant", "content": "ok", "tool_calls": [call]}]
    text = render(hf_tokenizer, messages)
    assert (
        'ok\n<tool_call>\n{"name": "Bash", "arguments": {"command": "pwd"}}\n</tool_call>' in text
    )


def test_template_renders_reasoning_and_thinking_switch(hf_tokenizer: Any) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "reasoning_content": "greet back"},
        {"role": "user", "content": "again"},
    ]
    thinking = render(hf_tokenizer, messages, add_generation_prompt=True, enable_thinking=True)
    quiet = render(hf_tokenizer, messages, add_generation_prompt=True, enable_thinking=False)
    assert "<|im_start|>assistant\n<think>\ngreet back\n</think>\n\nhello<|im_end|>" in thinking
    assert thinking.endswith("<|im_start|>assistant\n<think>\n")
    assert quiet.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # Without a generation prompt, nothing follows the last turn.
    assert render(hf_tokenizer, messages).endswith("again<|im_end|>\n")


def test_template_renders_mid_conversation_system_in_place(hf_tokenizer: Any) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "first"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "system", "content": "reminder"},
    ]
    text = render(hf_tokenizer, messages, tools=TOOLS)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>system\nreminder<|im_end|>\n")


def test_mlx_lm_infers_tool_parser_and_thinking(tiny: Any) -> None:
    _, tokenizer = tiny
    assert tokenizer.tool_call_start == "<tool_call>"
    assert tokenizer.tool_call_end == "</tool_call>"
    assert tokenizer.tool_parser is not None
    assert tokenizer.tool_parser('\n{"name": "Bash", "arguments": {"command": "ls"}}\n') == {
        "name": "Bash",
        "arguments": {"command": "ls"},
    }
    assert tokenizer.has_thinking
    assert tokenizer.think_start == "<think>"
    assert tokenizer.think_end == "</think>"


# --- cache ----------------------------------------------------------------------------------


def test_test_model_names() -> None:
    names = ("tiny", "small", "medium", "large", "tiny-moe", "demo")
    assert all(is_test_model_name(n) for n in names)
    assert not is_test_model_name("Qwen/Qwen3-8B")
    assert "random weights" in DEMO_NOTICE
    with pytest.raises(ValueError, match="nope"):
        ensure_test_model("nope")


def test_ensure_test_model_builds_once_under_concurrency(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path))
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(ensure_test_model("tiny"))) for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1
    built = results[0]
    assert built.parent == tmp_path / "test-models"
    # One finished directory and no staging leftovers.
    assert [p.name for p in built.parent.iterdir() if not p.name.endswith(".lock")] == [built.name]
    stamp = (built / "model.safetensors").stat().st_mtime_ns
    assert ensure_test_model("tiny") == built
    assert (built / "model.safetensors").stat().st_mtime_ns == stamp
    mlx_lm.load(str(built))


def test_a_recipe_two_names_share_is_built_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "demo" is the "small" recipe: the second name copies the first one's build.
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path))
    small = ensure_test_model("small")
    demo = ensure_test_model("demo")
    assert demo != small and demo.parent == small.parent
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (demo / name).read_bytes() == (small / name).read_bytes()
        # A copy keeps the build's time stamps; a second build would write new ones.
        assert (demo / name).stat().st_mtime_ns == (small / name).stat().st_mtime_ns
    assert (demo.stat().st_mode & 0o777) == (small.stat().st_mode & 0o777)
    assert not [p for p in demo.parent.iterdir() if p.name.startswith(".demo-")]  # no staging
    mlx_lm.load(str(demo))


def test_the_tokenizer_is_trained_once_per_size_and_is_the_same_as_trained_anew() -> None:
    families = [template_family(name) for name in sorted(TEMPLATE_FAMILIES)[:3]]
    train_tokenizer(families[0], 1024)
    misses = _learned_bpe.cache_info().misses
    tokenizers = [train_tokenizer(family, 1024) for family in families]
    assert _learned_bpe.cache_info().misses == misses  # no family trained again
    learned = _learned_bpe.__wrapped__(1024)  # a fresh training
    for family, tokenizer in zip(families, tokenizers, strict=True):
        anew = Tokenizer.from_str(learned)
        anew.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t in family.control_tokens]
        )
        anew.add_tokens(
            [AddedToken(t, special=False, normalized=False) for t in family.markup_tokens]
        )
        assert tokenizer.to_str() == anew.to_str()
        assert tokenizer.get_vocab_size() == 1024 + len(family.added_tokens)


# --- test doubles ---------------------------------------------------------------------------


def run_batch(
    model: Any, tokenizer: TokenizerWrapper, processors: list[list[Any]], max_tokens: int = 40
) -> list[tuple[list[int], str]]:
    """Generate for one short prompt per processor list; return tokens and finish reasons."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    generator = BatchGenerator(
        model, stop_tokens=[[e] for e in tokenizer.eos_token_ids], max_tokens=max_tokens
    )
    uids = generator.insert([prompt] * len(processors), logits_processors=processors)
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    finished: dict[int, str] = {}
    while len(finished) < len(uids):
        for response in generator.next_generated():
            tokens[response.uid].append(response.token)
            if response.finish_reason:
                finished[response.uid] = response.finish_reason
    generator.close()
    return [(tokens[uid], finished[uid]) for uid in uids]


def test_scripted_output_forces_exact_tokens_through_batch_generator(tiny: Any) -> None:
    model, tokenizer = tiny
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    text = 'Hi 🙂 <tool_call>\n{"name": "Bash", "arguments": {}}\n</tool_call>'
    scripted = ScriptedOutput()
    scripted.enqueue(text=text)
    scripted.enqueue(tokens=[5, 6, 7])
    first, second, unscripted = (scripted(f"request-{i}", tokenizer) for i in range(3))
    assert unscripted is None
    assert scripted.requests == ["request-0", "request-1", "request-2"]
    assert first is not None and second is not None
    # The unscripted sequence shares the batch and samples freely until max_tokens.
    results = run_batch(model, tokenizer, [first, second, []], max_tokens=30)
    expected = tokenizer.encode(text, add_special_tokens=False)
    assert results[0] == ([*expected, eos], "stop")
    assert tokenizer.decode(results[0][0][:-1]) == text
    assert results[1] == ([5, 6, 7, eos], "stop")
    assert results[2][1] == "length"


def test_scripted_output_first_token_is_forced_alone(tiny: Any) -> None:
    model, tokenizer = tiny
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    scripted = ScriptedOutput()
    scripted.enqueue(tokens=[42])
    processors = scripted("r", tokenizer)
    assert processors is not None and scripted.pending == 0
    assert run_batch(model, tokenizer, [processors]) == [([42, eos], "stop")]


def test_scripted_output_rejects_ambiguous_scripts() -> None:
    with pytest.raises(ValueError):
        ScriptedOutput().enqueue()
    with pytest.raises(ValueError):
        ScriptedOutput().enqueue(text="a", tokens=[1])


def test_failing_model_raises_on_demand_and_delegates(tiny: Any) -> None:
    model, tokenizer = tiny
    failures = ForwardFailures()
    failing = fail_forward(failures)(model)
    assert failing.layers is model.layers
    assert failing.args is model.args
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert len(list(mlx_lm.stream_generate(failing, tokenizer, prompt, max_tokens=2))) >= 1
    healthy_calls = failures.calls
    assert healthy_calls > 0 and failures.failures == 0

    failures.fail_next(after=1)
    with pytest.raises(RuntimeError, match="injected"):
        list(mlx_lm.stream_generate(failing, tokenizer, prompt, max_tokens=5))
    assert failures.failures == 1

    failures.fail_always()
    with pytest.raises(RuntimeError):
        failing(mx.array([prompt]))
    failures.heal()
    assert failing(mx.array([prompt])).shape[:2] == (1, len(prompt))


@pytest.mark.parametrize("family", sorted(TEMPLATE_FAMILIES))
def test_every_template_family_round_trips_a_tool_call(tmp_path: Path, family: str) -> None:
    _, tokenizer = mlx_lm.load(str(build_model(tmp_path, "tiny", template=family)))[:2]
    assert tokenizer.tool_parser.__module__ == f"mlx_lm.tool_parsers.{family_parser(family)}"
    arguments = {"command": "ls -l", "timeout": 5}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": "", "tool_calls": [call("Bash", arguments)]},
    ]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "Bash",
                "parameters": {
                    "type": "object",
                    "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
                },
            },
        }
    ]
    text = render(tokenizer, messages, tools=tools)
    start, end = tokenizer.tool_call_start, tokenizer.tool_call_end
    body = text.rsplit(start, 1)[1].split("<|im_end|>", 1)[0]
    if end:
        body = body.split(end, 1)[0]
    parsed = tokenizer.tool_parser(body, tools)
    parsed = parsed if isinstance(parsed, list) else [parsed]
    assert [(p["name"], p["arguments"]) for p in parsed] == [("Bash", arguments)]
    assert tokenizer.has_thinking


def family_parser(family: str) -> str:
    return TEMPLATE_FAMILIES[family].tool_parser


def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}
