"""A model's recommended sampling (generation_config.json): read by the store, shown by
`mlx models info`, and applied by the engine to every field a client leaves unset."""

from __future__ import annotations

import json
import logging
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from engine_helpers import LogitsRecorder, collect, recording_hook
from local_store import quantized_files, write_hub_repo

from mlxlaunch.cli.main import main
from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.decoding.sampling import (
    FALLBACK,
    ResolvedSampling,
    penalty_processors,
    resolve_sampling,
    sampler_for,
)
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.types import ChatMessage, Done, GenerationRequest, Sampling
from mlxlaunch.protocol.requests import CountTokensRequest, MessagesRequest
from mlxlaunch.server.mapping import to_generation_request
from mlxlaunch.store.facts import read_facts
from mlxlaunch.store.generation_config import (
    NO_DEFAULTS,
    SamplingDefaults,
    parse_sampling_defaults,
    read_sampling_defaults,
)
from mlxlaunch.testing.builder import build_model

# Qwen3's generation_config.json, as published.
QWEN3 = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
    "transformers_version": "4.51.0",
}


def _write(path: Path, content: str | bytes) -> Path:
    file = path / "generation_config.json"
    if isinstance(content, bytes):
        file.write_bytes(content)
    else:
        file.write_text(content, encoding="utf-8")
    return path


# --- the store reads the file ---------------------------------------------------------------


def test_a_published_config_is_read_whole(tmp_path: Path) -> None:
    defaults = read_sampling_defaults(_write(tmp_path, json.dumps(QWEN3)))
    assert defaults == SamplingDefaults(temperature=0.6, top_p=0.95, top_k=20)
    assert defaults.ignored == ()
    assert isinstance(defaults.top_k, int)
    assert defaults.describe() == "temperature 0.6, top_p 0.95, top_k 20"


def test_min_p_and_repetition_penalty_are_read(tmp_path: Path) -> None:
    config = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.05,
              "repetition_penalty": 1.05}  # fmt: skip
    defaults = read_sampling_defaults(_write(tmp_path, json.dumps(config)))
    assert defaults.stated() == config


def test_a_partial_config_states_only_what_it_names(tmp_path: Path) -> None:
    defaults = read_sampling_defaults(_write(tmp_path, '{"top_k": 64, "top_p": 0.95}'))
    assert defaults == SamplingDefaults(top_p=0.95, top_k=64)
    assert defaults.temperature is None and defaults.stated() == {"top_p": 0.95, "top_k": 64}


def test_no_file_or_no_sampling_keys_state_nothing(tmp_path: Path) -> None:
    assert read_sampling_defaults(tmp_path) == NO_DEFAULTS
    assert read_sampling_defaults(tmp_path).ignored == ()
    assert read_sampling_defaults(_write(tmp_path, '{"eos_token_id": 2}')).stated() == {}


def test_do_sample_false_keeps_the_recommended_values(tmp_path: Path) -> None:
    # do_sample is transformers' switch, not a recommendation; the values are (module doc).
    config = {"do_sample": False, "temperature": 0.6, "top_p": 0.9}
    defaults = read_sampling_defaults(_write(tmp_path, json.dumps(config)))
    assert defaults.stated() == {"temperature": 0.6, "top_p": 0.9}
    alone = read_sampling_defaults(_write(tmp_path, '{"do_sample": false}'))
    assert alone == NO_DEFAULTS  # not greedy: it states no sampling value


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "",
        "[1, 2]",
        '"temperature"',
        "null",
        "[" * 100_000,  # deeper than the parser's recursion
        b"\xff\xfe{\x00",  # not UTF-8
        '{"top_k": ' + "9" * 5000 + "}",  # beyond Python's integer-string limit
    ],
    ids=["broken", "empty", "list", "string", "null", "deep", "binary", "huge-int"],
)
def test_a_corrupt_file_states_nothing_and_says_so(tmp_path: Path, content: str | bytes) -> None:
    defaults = read_sampling_defaults(_write(tmp_path, content))
    assert defaults == NO_DEFAULTS
    assert len(defaults.ignored) == 1 and defaults.ignored[0].startswith("the whole file")


def test_a_directory_in_its_place_states_nothing(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").mkdir()
    defaults = read_sampling_defaults(tmp_path)
    assert defaults == NO_DEFAULTS and "unreadable" in defaults.ignored[0]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("temperature", "0.6"),
        ("temperature", True),
        ("temperature", -0.1),
        ("temperature", 50.0),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("temperature", 10**400),
        ("temperature", [0.6]),
        ("temperature", {"value": 0.6}),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", -math.inf),
        ("top_k", -1),
        ("top_k", 20.5),
        ("top_k", 10**6),
        ("top_k", False),
        ("min_p", -0.01),
        ("min_p", 1.01),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.1),
        ("repetition_penalty", 100.0),
    ],
)
def test_a_hostile_value_is_dropped_alone(tmp_path: Path, name: str, value: Any) -> None:
    config = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
              "repetition_penalty": 1.1} | {name: value}  # fmt: skip
    defaults = read_sampling_defaults(_write(tmp_path, json.dumps(config)))  # NaN, Infinity too
    kept = defaults.stated()
    assert name not in kept
    assert len(kept) == 4  # the others still count
    assert len(defaults.ignored) == 1 and defaults.ignored[0].startswith(name)


def test_edge_values_are_kept() -> None:
    edges = {"temperature": 0, "top_p": 1, "top_k": 0, "min_p": 1, "repetition_penalty": 1}
    defaults = parse_sampling_defaults(edges)
    assert defaults.stated() == edges and defaults.ignored == ()
    assert parse_sampling_defaults({"top_k": 40.0}).top_k == 40


def test_report_logs_what_is_used_and_what_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _write(tmp_path, '{"temperature": 0.6, "top_k": "many"}')
    with caplog.at_level(logging.INFO, logger="mlxlaunch.store.generation_config"):
        read_sampling_defaults(tmp_path)
        assert caplog.records == []  # listings stay quiet
        read_sampling_defaults(tmp_path, report=True)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(warnings) == 1 and "top_k 'many' (not a number)" in warnings[0]
    assert infos == [f"sampling defaults from {tmp_path / 'generation_config.json'}: "
                     "temperature 0.6"]  # fmt: skip


def test_model_facts_carry_the_defaults(tmp_path: Path) -> None:
    assert read_facts(tmp_path).sampling_defaults == NO_DEFAULTS
    _write(tmp_path, json.dumps(QWEN3))
    assert read_facts(tmp_path).sampling_defaults.stated() == {
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
    }


# --- `mlx models info` shows them -----------------------------------------------------------


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "200")  # each value on one line
    return tmp_path / "hub"


def test_info_shows_the_defaults_in_words_and_json(
    hub: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = quantized_files(4_000_000_000, 4, 40_960)
    write_hub_repo(hub, "test-org/Tuned", files | {"generation_config.json": json.dumps(QWEN3 | {
        "min_p": 0.0, "repetition_penalty": "strong"}).encode()})  # fmt: skip
    write_hub_repo(hub, "test-org/Plain", files)

    assert main(["models", "info", "test-org/Tuned", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["sampling_defaults"] == {"temperature": 0.6, "top_p": 0.95, "top_k": 20,
                                         "min_p": 0.0}  # fmt: skip
    assert info["sampling_ignored"] == ["repetition_penalty 'strong' (not a number)"]

    assert main(["models", "info", "test-org/Tuned"]) == 0
    lines = {line.split(maxsplit=1)[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "temperature 0.6, top_p 0.95, top_k 20, min_p 0" in lines["sampling"]
    assert "ignored: repetition_penalty 'strong'" in lines["sampling"]

    assert main(["models", "info", "test-org/Plain", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["sampling_defaults"] == {} and info["sampling_ignored"] == []
    assert main(["models", "info", "test-org/Plain"]) == 0
    lines = {line.split(maxsplit=1)[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "none recommended" in lines["sampling"]


# --- the server leaves unset fields unset ----------------------------------------------------


def _body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]} | fields


def test_mapping_leaves_unset_fields_none() -> None:
    gen = to_generation_request(MessagesRequest.model_validate(_body()))
    assert gen.sampling == Sampling()
    assert gen.sampling.temperature is None and gen.sampling.top_p is None
    assert gen.sampling.top_k is None and gen.sampling.min_p is None
    assert gen.sampling.repetition_penalty is None


def test_mapping_passes_only_what_the_client_set() -> None:
    gen = to_generation_request(MessagesRequest.model_validate(_body(temperature=0.2)))
    assert gen.sampling == Sampling(temperature=0.2)
    gen = to_generation_request(MessagesRequest.model_validate(_body(top_k=0, top_p=1.0)))
    assert gen.sampling == Sampling(top_p=1.0, top_k=0)  # set, even to "off", is set
    counted = to_generation_request(CountTokensRequest.model_validate(_body()))
    assert counted.sampling == Sampling()


# --- the engine resolves: client > model > fallback ------------------------------------------

MODEL = SamplingDefaults(temperature=0.6, top_p=0.95, top_k=20, min_p=0.05, repetition_penalty=1.1)


def test_unset_fields_take_the_models_values() -> None:
    assert resolve_sampling(Sampling(), MODEL) == ResolvedSampling(0.6, 0.95, 20, 0.05, 1.1)


def test_unset_fields_the_model_does_not_state_take_the_fallback() -> None:
    assert resolve_sampling(Sampling(), NO_DEFAULTS) == FALLBACK
    assert ResolvedSampling(1.0, 1.0, 0, 0.0, 1.0) == FALLBACK
    partial = SamplingDefaults(top_k=64)
    assert resolve_sampling(Sampling(), partial) == ResolvedSampling(1.0, 1.0, 64, 0.0, 1.0)


def test_the_clients_values_always_win_field_by_field() -> None:
    resolved = resolve_sampling(Sampling(temperature=0.2, top_k=0), MODEL)
    assert resolved == ResolvedSampling(0.2, 0.95, 0, 0.05, 1.1)
    everything = Sampling(temperature=1.0, top_p=1.0, top_k=5, min_p=0.0, repetition_penalty=1.0)
    assert resolve_sampling(everything, MODEL) == ResolvedSampling(1.0, 1.0, 5, 0.0, 1.0)


def test_greedy_stays_greedy_under_any_model_defaults() -> None:
    greedy = resolve_sampling(Sampling(temperature=0.0), MODEL)
    assert greedy.greedy and sampler_for(greedy) is None  # the generator's argmax
    # A model that recommends temperature 0 is greedy for clients that set none.
    assert sampler_for(resolve_sampling(Sampling(), SamplingDefaults(temperature=0.0))) is None
    # The penalty is a logits processor: it still applies (and greedy stays deterministic).
    assert len(penalty_processors(greedy)) == 1


def test_samplers_are_shared_per_setting_and_penalties_only_when_asked() -> None:
    a = sampler_for(resolve_sampling(Sampling(), MODEL))
    assert a is not None and a is sampler_for(resolve_sampling(Sampling(), MODEL))
    assert a is not sampler_for(resolve_sampling(Sampling(top_k=21), MODEL))
    assert penalty_processors(FALLBACK) == []


def test_the_sampler_applies_top_k_and_min_p() -> None:
    logprobs = mx.log(mx.array([[0.5, 0.3, 0.2]]))
    top_1 = sampler_for(resolve_sampling(Sampling(temperature=1.0, top_k=1), NO_DEFAULTS))
    min_p_1 = sampler_for(resolve_sampling(Sampling(temperature=1.0), SamplingDefaults(min_p=1.0)))
    plain = sampler_for(FALLBACK)
    assert top_1 is not None and min_p_1 is not None and plain is not None
    mx.random.seed(0)
    assert {int(top_1(logprobs).item()) for _ in range(30)} == {0}
    assert {int(min_p_1(logprobs).item()) for _ in range(30)} == {0}
    assert len({int(plain(logprobs).item()) for _ in range(60)}) > 1


def test_the_penalty_lowers_repeated_tokens() -> None:
    (penalty,) = penalty_processors(
        resolve_sampling(Sampling(), SamplingDefaults(repetition_penalty=2.0))
    )
    logits = mx.array([[2.0, -2.0, 1.0]])
    out = penalty(mx.array([0, 1]), logits)
    assert out.tolist() == [[1.0, -4.0, 1.0]]


# --- end to end: the defaults reach the sampler of a real model -------------------------------

PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight model with no generation_config.json of its own."""
    return build_model(tmp_path_factory.mktemp("sampling") / "plain", "tiny")


def _variant(root: Path, name: str, generation_config: str | None) -> Path:
    """A copy of the model at `root`, with this generation_config.json."""
    path = root.parent / name
    if not path.exists():
        shutil.copytree(root, path)
        if generation_config is not None:
            _write(path, generation_config)
    return path


@pytest.fixture
def probes() -> list[LogitsRecorder]:
    return []


@pytest.fixture
def engine_on(probes: list[LogitsRecorder]) -> Iterator[Any]:
    engines: list[Engine] = []

    hook = recording_hook(probes)

    def make(path: Path) -> Engine:
        engines.append(Engine(EngineConfig(model=str(path), logits_hook=hook)))
        return engines[-1]

    yield make
    for engine in engines:
        engine.close()


async def _generate(
    engine: Engine, probes: list[LogitsRecorder], sampling: Sampling
) -> tuple[list[int], float | None]:
    """The tokens of one request (prompt and output) and its first step's logsumexp."""
    request = GenerationRequest(
        messages=[ChatMessage("user", PROMPT)], max_tokens=24, sampling=sampling
    )
    events = await collect(engine.submit(request))
    assert isinstance(events[-1], Done)
    return probes[-1].context, probes[-1].first_logsumexp


@pytest.mark.slow
async def test_without_defaults_sampling_varies(
    model_root: Path, engine_on: Any, probes: list[LogitsRecorder]
) -> None:
    engine = engine_on(model_root)
    first, _ = await _generate(engine, probes, Sampling())
    second, _ = await _generate(engine, probes, Sampling())
    assert first != second  # temperature 1.0 over a random model's broad distribution


@pytest.mark.slow
async def test_a_models_top_k_1_makes_sampling_greedy(
    model_root: Path, engine_on: Any, probes: list[LogitsRecorder]
) -> None:
    engine = engine_on(_variant(model_root, "top-k-1", '{"do_sample": true, "top_k": 1}'))
    greedy, _ = await _generate(engine, probes, Sampling(temperature=0.0))
    for _ in range(2):  # at temperature 1.0 (the fallback), twice: both are the argmax path
        sampled, _ = await _generate(engine, probes, Sampling())
        assert sampled == greedy
    # The client's top_k wins over the model's: sampling varies again.
    off_1, _ = await _generate(engine, probes, Sampling(top_k=0))
    off_2, _ = await _generate(engine, probes, Sampling(top_k=0))
    assert off_1 != off_2


@pytest.mark.slow
async def test_a_models_min_p_and_penalty_reach_the_batch(
    model_root: Path, engine_on: Any, probes: list[LogitsRecorder]
) -> None:
    plain = engine_on(model_root)
    _, plain_logits = await _generate(plain, probes, Sampling(temperature=0.0))
    tuned = engine_on(
        _variant(
            model_root, "min-p", '{"temperature": 1.0, "min_p": 1.0, "repetition_penalty": 1.5}'
        )
    )
    greedy, tuned_logits = await _generate(tuned, probes, Sampling(temperature=0.0))
    assert (await _generate(tuned, probes, Sampling()))[0] == greedy  # min_p 1: the top token
    assert plain_logits is not None and tuned_logits is not None
    assert not math.isclose(plain_logits, tuned_logits)  # the penalty changed the logits


@pytest.mark.slow
async def test_a_corrupt_generation_config_does_not_stop_loading(
    model_root: Path, engine_on: Any, probes: list[LogitsRecorder], caplog: pytest.LogCaptureFixture
) -> None:
    path = _variant(model_root, "corrupt", '{"temperature": 0.6, "top_k": ')
    with caplog.at_level(logging.WARNING, logger="mlxlaunch.store.generation_config"):
        engine = engine_on(path)
        tokens, _ = await _generate(engine, probes, Sampling())
    assert tokens
    assert any("not valid JSON" in r.getMessage() for r in caplog.records)
