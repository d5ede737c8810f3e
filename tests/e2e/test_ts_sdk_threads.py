"""The official TypeScript SDK's default tool runner (`client.beta.messages.toolRunner`, over
message threads since 1.14) completes a multi-turn tool loop against a real server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from engine_helpers import Served

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

TS_SDK = "@anthropic-ai/sdk@1.15.0"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

SCRIPT = """
import Anthropic from '@anthropic-ai/sdk';
import { betaTool } from '@anthropic-ai/sdk/helpers/beta/json-schema';
const seen = [];
const client = new Anthropic({
  baseURL: process.env.BASE_URL, apiKey: 'x', maxRetries: 0,
  fetch: async (url, init) => {
    if (String(url).endsWith('/v1/messages')) seen.push(JSON.parse(init.body));
    return fetch(url, init);
  },
});
const weather = betaTool({
  name: 'get_weather', description: 'The weather in a city',
  inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  run: async ({ city }) => `It is sunny in ${city}.`,
});
const runner = client.beta.messages.toolRunner({
  model: 'm', max_tokens: 64, tools: [weather],
  messages: [{ role: 'user', content: 'Weather in Paris?' }],
});
const replies = [];
for await (const message of runner) replies.push(message);
console.log(JSON.stringify({
  stops: replies.map((r) => r.stop_reason),
  last: replies.at(-1).content.at(-1).text,
  threads: seen.map((b) => b.thread ?? null),
  second_roles: seen.length > 1 ? seen[1].messages.map((m) => m.role) : [],
}));
"""


def _npm_dir() -> Path:
    override = os.environ.get("MLXLAUNCH_TEST_NPM_DIR")
    return Path(override) if override else Path.home() / ".cache" / "mlxlaunch-tests" / "ts-sdk"


@pytest.fixture(scope="module")
def sdk_dir() -> Path:
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("node and npm are needed for the TypeScript SDK")
    where = _npm_dir()
    package = where / "node_modules" / "@anthropic-ai" / "sdk" / "package.json"
    if not package.exists() or json.loads(package.read_text())["version"] != "1.15.0":
        where.mkdir(parents=True, exist_ok=True)
        npm = ["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(where)]
        subprocess.run(
            [*npm, TS_SDK],
            check=True,
            timeout=600,
        )
    return where


def test_the_ts_tool_runner_completes_a_tool_loop_over_a_thread(
    sdk_dir: Path, served: Served
) -> None:
    server, scripted = served.server, served.scripted  # the shared served fixture
    scripted.enqueue("Let me look." + CALL)
    scripted.enqueue("Sunny in Paris.")
    script = sdk_dir / "tool_runner.mjs"
    script.write_text(SCRIPT)
    done = subprocess.run(
        ["node", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "BASE_URL": server.url},
        cwd=sdk_dir,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["stops"] == ["tool_use", "end_turn"]
    assert result["last"] == "Sunny in Paris."
    first, second = result["threads"]
    assert first == {"type": "create"}
    assert second["type"] == "continue"  # only the tool result went out...
    assert result["second_roles"] == ["user"]
    # ...and the model saw the whole conversation.
    prompt = json.dumps([m.content for m in scripted.requests[-1].messages])
    assert "Weather in Paris?" in prompt and "It is sunny in Paris." in prompt
