"""The `tiny-vision` test model (testing/vision.py): a real qwen2_5_vl architecture that
mlx-vlm loads with its processor, built offline; the image's pixels reach the logits through
the real preprocessing, image-token placement and vision tower. mlx-lm loads the same
directory text-only; the engine serves it through mlx-vlm (tests/test_vision_engine.py).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from engine_helpers import serve
from pictures import anthropic_block, png, png_pixels

from mlxlaunch.store.facts import read_facts
from mlxlaunch.testing import ensure_test_model

pytestmark = pytest.mark.slow  # builds and loads a model

mlx_vlm = pytest.importorskip("mlx_vlm")  # the `vision` extra (`make install` brings it)
Image = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def vision_dir() -> Path:
    return ensure_test_model("tiny-vision")


@pytest.fixture(scope="module")
def loaded(vision_dir: Path) -> tuple[Any, Any]:
    return mlx_vlm.load(str(vision_dir))


def _picture(data: bytes) -> Any:
    return Image.open(io.BytesIO(data)).convert("RGB")


def _prompt(processor: Any, images: int = 1) -> str:
    parts = [{"type": "image"}] * images + [{"type": "text", "text": "what is this?"}]
    messages = [{"role": "user", "content": parts}]
    return str(
        processor.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
    )


def _inputs(processor: Any, pictures: list[bytes]) -> Any:
    return processor(
        text=[_prompt(processor, len(pictures))],
        images=[_picture(p) for p in pictures],
        return_tensors="np",
        padding=True,
    )


def _last_logits(model: Any, processor: Any, picture: bytes) -> mx.array:
    inputs = _inputs(processor, [picture])
    logits = model(
        mx.array(inputs["input_ids"]),
        mx.array(inputs["pixel_values"]),
        mask=mx.array(inputs["attention_mask"]),
        image_grid_thw=mx.array(inputs["image_grid_thw"]),
    ).logits
    return logits[0, -1]


def test_it_is_a_vision_model_in_its_files(vision_dir: Path) -> None:
    config = json.loads((vision_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2_5_vl" and "vision_config" in config
    processor = json.loads((vision_dir / "preprocessor_config.json").read_text())
    assert processor["patch_size"] * processor["merge_size"] == 28
    facts = read_facts(vision_dir)
    assert facts.vision and facts.architecture_supported and not facts.problems()
    assert not read_facts(ensure_test_model("tiny")).vision


def test_the_template_places_the_image_and_the_processor_widens_it(loaded: Any) -> None:
    _, processor = loaded
    prompt = _prompt(processor)
    assert "<|vision_start|><|image_pad|><|vision_end|>what is this?" in prompt
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    # 56x84 pixels are 2x3 merged 28-pixel patches: 6 image tokens; 112x112 are 16.
    for (width, height), tokens in {(84, 56): 6, (112, 112): 16}.items():
        inputs = _inputs(processor, [png(width, height)])
        assert int((inputs["input_ids"] == pad).sum()) == tokens, (width, height)
        assert inputs["image_grid_thw"].tolist() == [[1, height // 14, width // 14]]


def test_the_pixels_reach_the_logits(loaded: Any) -> None:
    model, processor = loaded
    rows = [[(30 * x % 256, 50 * y % 256, 90) for x in range(56)] for y in range(56)]
    picture = png_pixels(rows)
    changed = [list(row) for row in rows]
    changed[20][31] = (255, 255, 255)  # one pixel
    first = _last_logits(model, processor, picture)
    again = _last_logits(model, processor, picture)
    other = _last_logits(model, processor, png_pixels(changed))
    assert mx.array_equal(first, again)
    assert float(mx.abs(first - other).max()) > 1e-6


def test_mlx_vlm_generates_from_an_image(loaded: Any) -> None:
    model, processor = loaded
    result = mlx_vlm.generate(
        model, processor, _prompt(processor), image=[_picture(png(56, 56))], max_tokens=4
    )
    assert result.generation_tokens == 4 and result.prompt_tokens > 4


def test_the_engine_serves_it_as_a_vision_model(vision_dir: Path) -> None:
    with serve(vision_dir) as served:
        served.scripted.enqueue("hello")
        reply = served.anthropic.messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.content[0].text == "hello"  # type: ignore[union-attr]
        assert served.engine.model_info is not None and served.engine.model_info.vision
        served.scripted.enqueue("a picture")
        image = [{"role": "user", "content": [anthropic_block(png(56, 56))]}]
        reply = served.anthropic.messages.create(model="m", max_tokens=5, messages=image)
        assert reply.content[0].text == "a picture"  # type: ignore[union-attr]


def test_models_info_says_which_models_see_images(
    vision_dir: Path,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from mlxlaunch.cli.main import main

    monkeypatch.setenv("MLXLAUNCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("COLUMNS", "200")
    for name, path in (("eyes", vision_dir), ("words", tiny_model_dir)):
        assert main(["models", "add", str(path), "--name", name]) == 0
    capsys.readouterr()
    lines = {}
    for name in ("eyes", "words"):
        assert main(["models", "info", name]) == 0
        out = capsys.readouterr().out
        lines[name] = next(line.split(maxsplit=1)[1] for line in out.splitlines()
                           if line.strip().startswith("images"))  # fmt: skip
        assert main(["models", "info", name, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["vision"] is (name == "eyes")
    assert lines["eyes"].startswith("yes, a vision model")
    assert lines["words"].startswith("no (a text-only model")
