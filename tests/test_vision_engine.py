"""Vision models in the engine (runtime/vision.py): `tiny-vision` loaded through mlx-vlm, its
images preprocessed by its own processor, embedded by its vision tower, and decoded by the
same batch, prefix cache and sampling as text. The reference is mlx-vlm itself: our greedy
tokens for an image prompt are the ones its own `stream_generate` writes."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from engine_helpers import LogitsRecorder, engine_maker, recording_hook
from mlx_lm.models.cache import KVCache
from pictures import png_pixels

from mlxlaunch.engine.cache.prefix import MIN_DISK_TOKENS
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.prompt.render import PromptRenderer
from mlxlaunch.engine.runtime.vision import VisionLanguageModel, load_vision, set_row_shifts
from mlxlaunch.engine.types import (
    ChatMessage,
    Done,
    GenerationRequest,
    ImageInput,
    InvalidRequest,
    Sampling,
    ToolCallEvent,
    ToolChoice,
    ToolSpec,
    image_slot,
)
from mlxlaunch.errors import ModelLoadError
from mlxlaunch.testing import ensure_test_model
from mlxlaunch.testing.scripted import ScriptedOutput

pytestmark = pytest.mark.slow  # builds and loads a model

mlx_vlm = pytest.importorskip("mlx_vlm")  # the `vision` extra
Image = pytest.importorskip("PIL.Image")

STEPS = 8


def _rows(width: int, height: int, seed: int = 0) -> list[list[tuple[int, int, int]]]:
    return [
        [((30 * x + seed) % 256, 50 * y % 256, 90) for x in range(width)] for y in range(height)
    ]


def picture(width: int = 84, height: int = 56, *, seed: int = 0) -> bytes:
    return png_pixels(_rows(width, height, seed))


def one_pixel_changed(width: int = 84, height: int = 56) -> bytes:
    rows = _rows(width, height)
    rows[20][31] = (255, 255, 255)
    return png_pixels(rows)


def image_request(
    rid: str, data: bytes, text: str = "what is this?", max_tokens: int = STEPS
) -> GenerationRequest:
    return GenerationRequest(
        messages=[ChatMessage("user", image_slot(0) + text)],
        images=[ImageInput("image/png", data)],
        max_tokens=max_tokens,
        sampling=Sampling(temperature=0.0),
        request_id=rid,
    )


def text_request(rid: str, text: str) -> GenerationRequest:
    return GenerationRequest(
        messages=[ChatMessage("user", text)],
        max_tokens=STEPS,
        sampling=Sampling(temperature=0.0),
        request_id=rid,
    )


@pytest.fixture(scope="module")
def vision_dir() -> Path:
    return ensure_test_model("tiny-vision")


@pytest.fixture
def make(vision_dir: Path) -> Iterator[Callable[..., Engine]]:
    with engine_maker(vision_dir) as maker:
        yield maker


async def _run(engine: Engine, request: GenerationRequest) -> Done:
    events = [e async for e in engine.submit(request)]
    done = events[-1]
    assert isinstance(done, Done)
    return done


def _generated(recorder: LogitsRecorder) -> list[int]:
    assert recorder.prompt_length is not None
    return recorder.context[recorder.prompt_length :]


def test_the_engine_loads_it_through_mlx_vlm(make: Callable[..., Engine]) -> None:
    engine = make()

    async def go() -> None:
        info = await engine.load()
        assert info.vision
        loaded = engine._worker.loaded
        assert loaded is not None and isinstance(loaded.model, VisionLanguageModel)
        assert loaded.vision is loaded.model
        done = await _run(engine, text_request("t", "hello there"))
        assert done.usage.output_tokens == STEPS

    asyncio.run(go())


def test_the_wrapper_computes_mlx_vlms_logits_in_chunks(vision_dir: Path) -> None:
    # The embedding override and 3-D positions, chunk by chunk (a chunk boundary inside the
    # image's run), then a decode step: the same logits as mlx-vlm's model on the whole prompt.
    model, _ = load_vision(vision_dir)
    processor = model._processor
    data = picture()
    parts = [{"type": "image"}, {"type": "text", "text": "what is this?"}]
    prompt = processor.tokenizer.apply_chat_template(
        [{"role": "user", "content": parts}], add_generation_prompt=True, tokenize=False
    )
    pil = Image.open(io.BytesIO(data)).convert("RGB")
    inputs = processor(text=[prompt], images=[pil], return_tensors="np", padding=True)
    pixels, grid = mx.array(inputs["pixel_values"]), mx.array(inputs["image_grid_thw"])
    reference = model.vlm(mx.array(inputs["input_ids"]), pixels, image_grid_thw=grid).logits
    image = model.prepare(data)
    ids = model.expand(processor.tokenizer.encode(prompt, add_special_tokens=False), [image])
    assert len(ids) == inputs["input_ids"].shape[1] and image.tokens == 6
    cache = [KVCache() for _ in model.layers]
    outs = []
    for start in range(0, len(ids), 5):
        set_row_shifts(model, [model.table.shift_of(ids[:start])], prefill=True)
        outs.append(model(mx.array([ids[start : start + 5]]), cache=cache))
    assert float(mx.abs(mx.concatenate(outs, axis=1) - reference).max()) < 1e-5
    token = int(mx.argmax(reference[0, -1]))
    set_row_shifts(model, [model.table.shift_of(ids)], prefill=False)
    step = model(mx.array([[token]]), cache=cache)
    whole = [*inputs["input_ids"][0].tolist(), token]
    expected = model.vlm(mx.array([whole]), pixels, image_grid_thw=grid).logits[0, -1]
    assert float(mx.abs(step[0, -1] - expected).max()) < 1e-5


def test_greedy_tokens_are_mlx_vlms_own(vision_dir: Path) -> None:
    recorders: list[LogitsRecorder] = []
    data = picture()
    request = image_request("v", data)
    with engine_maker(vision_dir, logits_hook=recording_hook(recorders)) as make:
        engine = make()
        asyncio.run(_run(engine, request))
        loaded = engine._worker.loaded
        assert loaded is not None
        prompt = PromptRenderer(loaded.tokenizer).render_text(request)
    ours = _generated(recorders[0])
    vlm, processor = mlx_vlm.load(str(vision_dir))
    pil = Image.open(io.BytesIO(data)).convert("RGB")
    theirs = [
        int(r.token)
        for r in mlx_vlm.stream_generate(
            vlm, processor, prompt, image=[pil], max_tokens=STEPS, temperature=0.0
        )
    ]
    assert len(ours) == STEPS - 1
    assert ours == theirs[: STEPS - 1]


def test_a_template_that_places_no_image_is_a_400(make: Callable[..., Engine]) -> None:
    engine = make()
    request = image_request("v", picture())
    request.messages[0].content = "no slot here"

    async def go() -> None:
        with pytest.raises(InvalidRequest):
            await engine.count_tokens(
                GenerationRequest(
                    messages=[ChatMessage("user", image_slot(3))],
                    images=request.images,
                    max_tokens=1,
                )
            )
        with pytest.raises(InvalidRequest, match=r"not one|cannot be read"):
            broken = image_request("b", b"\x89PNG\r\n\x1a\nbroken")
            await _run(engine, broken)

    asyncio.run(go())


def test_count_tokens_counts_the_image_run(make: Callable[..., Engine]) -> None:
    engine = make()

    async def go() -> tuple[int, int, int]:
        small = await engine.count_tokens(image_request("a", picture(56, 56)))
        large = await engine.count_tokens(image_request("b", picture(112, 112)))
        done = await _run(engine, image_request("c", picture(112, 112)))
        return small, large, done.usage.prompt_tokens

    small, large, submitted = asyncio.run(go())
    # 56x56 pixels are 2x2 merged 28-pixel patches (4 tokens), 112x112 are 4x4 (16).
    assert large - small == 16 - 4
    assert submitted == large


def _prefix_stats(engine: Engine) -> Any:
    return engine.stats()


def test_a_repeated_image_reuses_its_kv_and_a_changed_pixel_does_not(
    make: Callable[..., Engine],
) -> None:
    engine = make()
    text = " and tell me in many words what you see there, in detail, please." * 8

    async def go() -> list[Done]:
        first = await _run(engine, image_request("a", picture(), text, max_tokens=2))
        again = await _run(engine, image_request("b", picture(), text, max_tokens=2))
        other = await _run(engine, image_request("c", one_pixel_changed(), text, max_tokens=2))
        return [first, again, other]

    first, again, other = asyncio.run(go())
    prompt = first.usage.prompt_tokens
    assert first.usage.cached_tokens == 0
    # The whole prompt but its last token comes from the cache: the image's run included.
    assert again.usage.cached_tokens >= prompt - 2
    # Only what precedes the image is shared: the run differs from its first token on.
    assert other.usage.cached_tokens < 8
    assert again.usage.prompt_tokens == other.usage.prompt_tokens == prompt


def test_the_next_turn_reuses_the_image_and_the_reply(vision_dir: Path) -> None:
    # The reply's ids are kept for the next turn (the image's run narrowed back to the one
    # token the template writes): the next turn reuses as much as a text conversation's does.
    script = ScriptedOutput()

    def two_turns(engine: Engine, first_request: GenerationRequest) -> tuple[Done, Done]:
        async def go() -> tuple[Done, Done]:
            script.enqueue("a striped picture")
            first = await _run(engine, first_request)
            follow = GenerationRequest(
                messages=[
                    *first_request.messages,
                    ChatMessage("assistant", "a striped picture"),
                    ChatMessage("user", "and then?"),
                ],
                images=first_request.images,
                max_tokens=2,
                request_id=first_request.request_id + "-next",
            )
            return first, await _run(engine, follow)

        return asyncio.run(go())

    unread: list[int] = []
    with engine_maker(vision_dir, logits_hook=script) as make:
        for request in (image_request("i", picture(), max_tokens=20), text_request("t", "hi")):
            first, second = two_turns(make(), request)
            assert first.stop_reason == "end_turn"
            unread.append(first.usage.prompt_tokens + first.usage.output_tokens
                          - second.usage.cached_tokens)  # fmt: skip
    assert unread[0] == unread[1] and unread[0] <= 2


def test_an_image_request_in_a_batch_of_four_writes_what_it_writes_alone(
    vision_dir: Path,
) -> None:
    requests = [
        image_request("img", picture()),
        text_request("t1", "the first text request"),
        image_request("img2", picture(56, 56, seed=7), "and this one?"),
        text_request("t3", "a third, longer text request with more words in it"),
    ]

    def tokens(together: bool) -> dict[str, list[int]]:
        recorders: list[LogitsRecorder] = []
        out: dict[str, list[int]] = {}
        with engine_maker(vision_dir, logits_hook=recording_hook(recorders)) as make:
            engine = make(max_concurrency=4)

            async def go() -> None:
                if together:
                    await asyncio.gather(*(_run(engine, r) for r in requests))
                else:
                    for r in requests:
                        await _run(engine, r)

            asyncio.run(go())
        for recorder in recorders:
            assert recorder.prompt_length is not None
            key = tuple(recorder.context[: recorder.prompt_length])
            out[str(hash(key))] = _generated(recorder)
        return out

    alone, together = tokens(False), tokens(True)
    assert len(alone) == 4 and alone == together


def test_time_to_first_token_cold_and_with_the_image_cached(
    make: Callable[..., Engine], capsys: pytest.CaptureFixture[str]
) -> None:
    engine = make()
    big = picture(224, 224)

    async def timed(rid: str) -> float:
        start = time.perf_counter()
        async for _ in engine.submit(image_request(rid, big, max_tokens=1)):
            pass
        return time.perf_counter() - start

    async def go() -> tuple[float, float]:
        await engine.load()
        await _run(engine, text_request("warm", "warm up"))
        return await timed("cold"), await timed("cached")

    cold, cached = asyncio.run(go())
    with capsys.disabled():
        print(f"\n1-image (224x224, 64 tokens) TTFT cold {cold * 1000:.1f} ms, cached "
              f"{cached * 1000:.1f} ms")  # fmt: skip
    assert cached < cold


def test_a_restarted_engine_reads_an_images_kv_from_the_disk_tier(
    vision_dir: Path, tmp_path: Path
) -> None:
    # The disk tier keys entries by token ids too: an image's run, derived from its bytes,
    # finds its KV again after a restart (the image table is empty until the request comes).
    # The prompt is longer than the disk tier's least (MIN_DISK_TOKENS).
    text = " and tell me in many words what you see there, in detail, please." * 24

    def turn(rid: str, more: str = "") -> GenerationRequest:
        return image_request(rid, picture(), text + more, max_tokens=4)

    recorders: list[LogitsRecorder] = []
    with engine_maker(vision_dir, cache_dir=tmp_path, cache_block_tokens=16) as make:
        engine = make()
        asyncio.run(_run(engine, turn("a")))
        assert asyncio.run(_run(engine, turn("b", " Now."))).usage.cached_tokens > 0
    hook = recording_hook(recorders)
    with engine_maker(vision_dir, cache_dir=tmp_path, cache_block_tokens=16) as make:
        restarted = make(logits_hook=hook)

        async def again() -> Done:
            await restarted.load()
            assert restarted.stats().cache.disk_loads >= 1
            return await _run(restarted, turn("c", " Then."))

        done = asyncio.run(again())
        plain = make(logits_hook=hook, cache_dir=None, cache_memory_bytes=0)
        asyncio.run(_run(plain, turn("d", " Then.")))
    assert done.usage.cached_tokens > MIN_DISK_TOKENS
    assert _generated(recorders[0]) == _generated(recorders[1])


def test_a_vision_model_drafts_by_prompt_lookup_not_with_a_draft_model(
    vision_dir: Path, tiny_model_dir: Path
) -> None:
    # A text draft model cannot see the images its drafts would continue from.
    with engine_maker(vision_dir, draft_model=str(tiny_model_dir)) as make:
        auto = make()
        asyncio.run(auto.load())
        assert auto._worker.speculation.lookup and auto._worker.speculation.draft is None
        with pytest.raises(ModelLoadError, match="a draft model reads no images"):
            asyncio.run(make(speculate="draft").load())


def test_a_forced_tool_call_after_an_image_is_a_call(make: Callable[..., Engine]) -> None:
    # The tool grammar reads the prompt's context too, image ids and all.
    engine = make()
    request = image_request("tool", picture(), "read what it says", max_tokens=200)
    request.tools = [
        ToolSpec(
            "Read", "read a file", {"type": "object", "properties": {"path": {"type": "string"}}}
        )
    ]
    request.tool_choice = ToolChoice("tool", name="Read", parallel=False)

    async def go() -> list[Any]:
        return [e async for e in engine.submit(request)]

    events = asyncio.run(go())
    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    # The random model may write a long path (then cut off): the call is there, as JSON.
    assert [c.name for c in calls] == ["Read"]
    assert isinstance(json.loads(calls[0].arguments), dict)
