"""The engine's own request and event types.

These are the only types the HTTP layer exchanges with the engine. They speak the language of
chat templates and generation (messages, tool calls, tokens), never Anthropic field names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from mlxlaunch.store.dialects import Dialect
from mlxlaunch.store.generation_config import NO_DEFAULTS, SamplingDefaults

Role = Literal["system", "user", "assistant", "tool"]


# A freeform tool's raw text is, to the model, the call's one string parameter of this name.
FREEFORM_INPUT = "input"


@dataclass(frozen=True)
class InputGrammar:
    """The grammar a freeform tool's one string argument follows: Lark rules (with `start`),
    or one regular expression; `field` names where the client put it, for errors."""

    syntax: Literal["lark", "regex"]
    definition: str
    field: str = "grammar"


@dataclass(frozen=True)
class ToolSpec:
    """A tool offered to the model: name, description and JSON schema of its arguments.

    A freeform tool (raw text in, such as Codex's `apply_patch`) is a tool with one string
    parameter whose text follows `grammar`, where the model's call syntax allows it."""

    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool = False
    grammar: InputGrammar | None = None


@dataclass(frozen=True)
class ToolCallRecord:
    """A tool call in the conversation history (an assistant turn that called a tool)."""

    id: str
    name: str
    arguments: dict[str, Any]


# Where an image stands in a message's content (a vision model's request): `image_slot(i)`,
# the request's i-th image, between two object replacement characters.
IMAGE_SLOT = "\ufffc"
_SLOT = re.compile("\ufffc([0-9]+)\ufffc")


def image_slot(index: int) -> str:
    """The mark of the request's `index`-th image in a message's content."""
    return f"{IMAGE_SLOT}{index}{IMAGE_SLOT}"


def split_image_slots(content: str) -> list[str | int]:
    """`content` as its texts and, where each image stands, the image's index."""
    out: list[str | int] = []
    at = 0
    for found in _SLOT.finditer(content):
        if found.start() > at:
            out.append(content[at : found.start()])
        out.append(int(found.group(1)))
        at = found.end()
    if at < len(content):
        out.append(content[at:])
    return out


def images_in_order(messages: list[ChatMessage]) -> list[int]:
    """The indices of the images the messages' contents place, in the order they stand."""
    return [int(found.group(1)) for m in messages for found in _SLOT.finditer(m.content)]


@dataclass(frozen=True)
class ImageInput:
    """An image of the request for a vision model: its encoded bytes (PNG, JPEG, GIF, WebP)."""

    media_type: str
    data: bytes = field(repr=False)


@dataclass
class ChatMessage:
    """One message in chat-template shape.

    `reasoning` carries thinking history of an assistant turn; `tool_calls` the calls it made;
    a `tool` message answers the call `tool_call_id` (named `name`).
    """

    role: Role
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False


@dataclass(frozen=True)
class Sampling:
    """A request's sampling parameters; temperature 0 means greedy.

    None: the client did not set it; the model's recommended value applies then (its
    `ModelInfo.sampling_defaults`), else the engine's fallback (`decoding/sampling.py`).
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # 0: off
    min_p: float | None = None  # 0: off
    repetition_penalty: float | None = None  # 1: off
    seed: int | None = None


ToolChoiceMode = Literal["auto", "none", "any", "tool"]


@dataclass(frozen=True)
class ToolChoice:
    mode: ToolChoiceMode = "auto"
    name: str | None = None  # with mode == "tool"
    parallel: bool = True  # False: at most one call
    wire: str | None = None  # the mode as the client's API spells it ("required"), for errors


RequestKind = Literal["main", "subagent", "title", "other"]


@dataclass
class GenerationRequest:
    """Everything the engine needs to render, admit and generate one request."""

    messages: list[ChatMessage]
    max_tokens: int
    tools: list[ToolSpec] = field(default_factory=list)
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    sampling: Sampling = field(default_factory=Sampling)
    thinking: bool = False
    thinking_budget: int | None = None
    stop_sequences: list[str] = field(default_factory=list)
    response_schema: dict[str, Any] | None = None  # JSON schema the text must satisfy
    # Where the client's API puts the response schema and a tool's schema, so an error names
    # the field the client sent (`tools['t'].<tool_schema_field>`).
    schema_field: str = "output_config.format.schema"
    tool_schema_field: str = "input_schema"
    request_id: str = ""
    kind: RequestKind = "other"  # for stats and the dashboard only
    model_alias: str = ""  # the id the client asked for, echoed in stats
    cache_key: str = ""  # the client's conversation key (Responses `prompt_cache_key`), in stats
    # Keep this request's conversation (prompt and reply) in the prefix cache ahead of
    # anything unpinned of its priority for this long (never ahead of the main session, and
    # within the cache's pin budget): a conversation continued by id needs it next turn.
    pin_prefix_s: float = 0.0
    # A vision model's images: `image_slot(i)` in a message's content stands for images[i].
    images: list[ImageInput] = field(default_factory=list)


# --- events -------------------------------------------------------------------------------

StopReason = Literal[
    "end_turn",  # the model ended its turn (EOS)
    "max_tokens",  # hit the request's max_tokens
    "stop_sequence",  # one of the request's stop sequences matched
    "tool_use",  # the turn ended with tool calls
    "context_window",  # generation reached the model's context window
    "cancelled",  # the client went away
]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int  # whole rendered prompt
    cached_tokens: int = 0  # of which taken from the prefix cache
    output_tokens: int = 0

    @property
    def prefilled_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass(frozen=True)
class Timings:
    queue_s: float = 0.0
    ttft_s: float = 0.0  # admission to first token
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    drafted_tokens: int = 0  # speculative decoding: tokens drafted, and of those accepted
    accepted_tokens: int = 0


@dataclass(frozen=True)
class Admitted:
    """The request was admitted; sent before any token (lets SSE start at once)."""

    request_id: str
    prompt_tokens: int
    cached_tokens: int
    max_tokens: int  # after clamping to the context window
    clamped: bool = False
    # `cached_tokens` against what the prefix cache held of this prompt (engine/cache/misses.py):
    # all of it, within a seam (prefix_hit), clearly less (partial), nothing (fresh); None: not
    # judged (read `cached_tokens` alone).
    cache_reuse: Literal["prefix_hit", "partial", "fresh"] | None = None
    # The model that serves it, where a server serves several (engine/models.py); "": the one.
    served_by: str = ""


@dataclass(frozen=True)
class Progress:
    """Prefill progress; also a heartbeat during long prefills."""

    done_tokens: int
    total_tokens: int


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ThinkingDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    """A tool call whose name is known while its arguments are still being generated; they
    follow as `ToolInputDelta` pieces and the call ends with its `ToolCallEvent`."""

    id: str
    name: str


@dataclass(frozen=True)
class ToolInputDelta:
    """The next piece of a started call's arguments (JSON text; the pieces concatenate to
    the call's final `arguments`)."""

    id: str
    partial_json: str


@dataclass(frozen=True)
class ToolCallEvent:
    """One complete tool call. `arguments` is the JSON text of the arguments object.

    A call announced by `ToolCallStart` (same id) ends here; its `ToolInputDelta` pieces
    concatenate to `arguments`. A call without a start arrives whole."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Done:
    stop_reason: StopReason
    usage: Usage
    stop_sequence: str | None = None
    timings: Timings = field(default_factory=Timings)


EngineEvent = (
    Admitted
    | Progress
    | TextDelta
    | ThinkingDelta
    | ToolCallStart
    | ToolInputDelta
    | ToolCallEvent
    | Done
)


# --- errors raised from submit() / count_tokens() ----------------------------------------


class EngineError(Exception):
    """Base of errors the engine raises to a caller."""


class InvalidRequest(EngineError):
    """The request cannot be served as given (a client mistake)."""


class PromptTooLong(InvalidRequest):
    def __init__(self, prompt_tokens: int, maximum: int) -> None:
        super().__init__(f"prompt is too long: {prompt_tokens} tokens > {maximum} maximum")
        self.prompt_tokens = prompt_tokens
        self.maximum = maximum


class Overloaded(EngineError):
    """Admission control refused the request; retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class GenerationFailed(EngineError):
    """Generation of this request failed (model forward, out of memory, …)."""


class EngineUnavailable(EngineError):
    """The model could not be loaded or the engine is shutting down."""


class ModelNotServed(EngineError):
    """The request names a model this server does not serve and cannot load (a 404)."""


class ClusterLost(EngineUnavailable):
    """A rank of the cluster died or cannot be reached: the cluster cannot go on."""


# --- model facts ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelInfo:
    """What the loaded model is and which output syntaxes it speaks."""

    id: str  # the name it was loaded by (a local directory or a hub id)
    path: str  # local directory holding the weights
    context_window: int  # tokens, prompt and output together
    has_thinking: bool = False
    think_start: str | None = None
    think_end: str | None = None
    tool_call_start: str | None = None
    tool_call_end: str | None = None
    tool_format: str | None = None  # the dialect's name, e.g. "json_tools", "harmony"
    dialect: Dialect | None = None  # how the model writes tool calls and thinking
    vision: bool = False
    eos_token_ids: tuple[int, ...] = ()
    sampling_defaults: SamplingDefaults = NO_DEFAULTS  # from generation_config.json
