"""Nothing a model ships or a request sends runs as code: chat templates render in
transformers' sandboxed Jinja environment, request text is data (never template source), and
a model's custom Python (`auto_map`) is never imported."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mlx_lm.utils import load_tokenizer

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.prompt.render import PromptRenderer
from mlxlaunch.engine.runtime.mlx_lm_internals import hf_tokenizer_of
from mlxlaunch.engine.types import ChatMessage, GenerationRequest
from mlxlaunch.server.app import ServerSettings
from mlxlaunch.server.runner import start_server

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model

TOKEN = "template-test-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}

# Each tries to reach Python internals from a template; `{marker}` is a file it would create.
ESCAPES = {
    "mro": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "cycler": "{{ cycler.__init__.__globals__.os.popen('touch {marker}').read() }}",
    "joiner": "{{ joiner.__init__.__globals__['os'].system('touch {marker}') }}",
    "lipsum": "{{ lipsum.__globals__['os'].system('touch {marker}') }}",
    "attr-filter": (
        "{{ (cycler|attr('__init__')|attr('__globals__'))['os'].system('touch {marker}') }}"
    ),
    "namespace": "{% set ns = namespace(__class__=1) %}{{ ns }}",
    "namespace-set": "{% set ns = namespace() %}{% set ns.__dict__ = 1 %}{{ ns }}",
    "format": "{{ '{0.__init__.__globals__[os]}'.format(cycler) }}",
    "self": "{{ self._TemplateReference__context.cycler.__init__.__globals__ }}",
    "mutate": "{% set m = messages %}{{ m.append(1) }}{{ m.clear() }}",
}


def _request(text: str = "hi") -> GenerationRequest:
    return GenerationRequest(messages=[ChatMessage(role="user", content=text)], max_tokens=2)


@pytest.fixture(scope="module")
def renderer(tiny_model_dir: Path) -> PromptRenderer:
    return PromptRenderer(load_tokenizer(tiny_model_dir))


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_template_escapes_fail_and_run_nothing(
    renderer: PromptRenderer, tmp_path: Path, name: str
) -> None:
    marker = tmp_path / "escaped"
    hf_tokenizer = hf_tokenizer_of(renderer.tokenizer)
    original = hf_tokenizer.chat_template
    hf_tokenizer.chat_template = ESCAPES[name].replace("{marker}", str(marker))
    try:
        with pytest.raises(Exception) as caught:
            renderer.render_text(_request())
    finally:
        hf_tokenizer.chat_template = original
    assert type(caught.value).__name__ in ("SecurityError", "UndefinedError"), caught.value
    assert not marker.exists()
    assert "hi" in renderer.render_text(_request())  # the real template still works


def test_request_text_is_data_not_template(renderer: PromptRenderer) -> None:
    text = "{{ 7*7 }}{% for x in range(3) %}x{% endfor %}{{ cycler.__init__ }}"
    rendered = renderer.render_text(_request(text))
    assert text in rendered and "49" not in rendered


@pytest.fixture
def model_copy(tiny_model_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "model"
    shutil.copytree(tiny_model_dir, copy)
    return copy


def _edit_json(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.fixture
def evil_template_server(model_copy: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    marker = tmp_path / "escaped"
    template = ESCAPES["cycler"].replace("{marker}", str(marker))
    _edit_json(model_copy / "tokenizer_config.json", chat_template=template)
    engine = Engine(EngineConfig(model=str(model_copy)))
    engine.start()
    try:
        with start_server(engine, ServerSettings(auth_token=TOKEN)) as handle:
            yield handle.url, marker
    finally:
        engine.close()


def test_a_hostile_template_is_an_error_envelope_and_the_server_survives(
    evil_template_server: tuple[str, Path],
) -> None:
    url, marker = evil_template_server
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        for stream in (False, True):
            response = httpx.post(url + path, json={**body, "stream": stream}, headers=AUTH)
            assert response.status_code in (400, 500), response.text
            error = response.json()
            assert error["type"] == "error" and "could not be rendered" in error["error"]["message"]
    assert not marker.exists()
    assert httpx.get(url + "/health").json()["status"] == "ok"


def test_model_code_is_never_imported(model_copy: Path, tmp_path: Path) -> None:
    """`auto_map` custom code (tokenizer and model) would run on import: it must not."""
    marker = tmp_path / "imported"
    code = f"open({str(marker)!r}, 'w').write('ran')\n"
    for module, base in (
        ("evil_tokenizer", "from transformers import PreTrainedTokenizerFast as Base"),
        ("evil_model", "import torch.nn as nn\nBase = nn.Module"),
    ):
        (model_copy / f"{module}.py").write_text(f"{code}{base}\nclass Evil(Base):\n    pass\n")
    _edit_json(
        model_copy / "tokenizer_config.json",
        tokenizer_class="Evil",
        auto_map={"AutoTokenizer": ["evil_tokenizer.Evil", None]},
    )
    _edit_json(model_copy / "config.json", auto_map={"AutoModelForCausalLM": "evil_model.Evil"})
    engine = Engine(EngineConfig(model=str(model_copy)))
    engine.start()
    try:
        # Loading (with transformers' own tokenizer class) or refusing are both fine; with
        # trust_remote_code=True this same directory does create the marker.
        with contextlib.suppress(Exception):
            asyncio.run(engine.load())
    finally:
        engine.close()
    assert not marker.exists()
