"""Wire types of context management (beta `context-management-2025-06-27`).

A request's `context_management.edits` asks the server to clear old content before the prompt
reaches the model; the answer says what was cleared. Names, shapes and defaults follow the
`anthropic` SDK's beta types (`BetaContextManagementConfigParam`, `BetaClearToolUses20250919
EditParam`, `BetaClearThinking20251015EditParam`, `BetaContextManagementResponse`,
`BetaCountTokensContextManagementResponse`); defaults are those Anthropic documents.

Edits are a discriminated union on `type`, so an unknown edit type is a 400 naming it (as the
API answers). `compact_20260112` (server-side summarisation) is known to the API but not done
here: it is refused by name rather than silently ignored. Anthropic also refuses
`clear_thinking_20251015` when the request's thinking is off; here it applies all the same
(the history's thinking is still there to clear), so a client whose thinking a launcher
turned off is not wedged by an edit it always sends.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, model_validator

from mlxlaunch.protocol import limits

CONTEXT_MANAGEMENT_BETA = "context-management-2025-06-27"
CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
COMPACT = "compact_20260112"

# Far above any window; keeps a hostile value a plain number.
MAX_TOKEN_VALUE = 1 << 31
Count = Annotated[int, Field(strict=True, ge=0, le=MAX_TOKEN_VALUE)]
PositiveCount = Annotated[int, Field(strict=True, ge=1, le=MAX_TOKEN_VALUE)]
ToolName = Annotated[str, Field(strict=True, min_length=1, max_length=limits.MAX_NAME_CHARS)]


class _Wire(BaseModel):
    # Unknown fields are dropped, as everywhere in a request (protocol/requests.py).
    model_config = ConfigDict(extra="ignore")


# --- clear_tool_uses_20250919 ---------------------------------------------------------------


class InputTokensTrigger(_Wire):
    """Fires once the prompt holds more than `value` tokens."""

    type: Literal["input_tokens"]
    value: PositiveCount


class ToolUsesTrigger(_Wire):
    """Fires once the conversation holds more than `value` tool uses."""

    type: Literal["tool_uses"]
    value: PositiveCount


Trigger = Annotated[InputTokensTrigger | ToolUsesTrigger, Discriminator("type")]


class ToolUsesKeep(_Wire):
    type: Literal["tool_uses"]
    value: Count


class InputTokensClearAtLeast(_Wire):
    type: Literal["input_tokens"]
    value: Count


class ClearToolUsesEdit(_Wire):
    """Replace the oldest tool results (and optionally their calls' inputs) by a placeholder."""

    type: Literal["clear_tool_uses_20250919"]
    trigger: Trigger = Field(
        default_factory=lambda: InputTokensTrigger(type="input_tokens", value=100_000)
    )
    keep: ToolUsesKeep = Field(default_factory=lambda: ToolUsesKeep(type="tool_uses", value=3))
    clear_at_least: InputTokensClearAtLeast | None = None
    exclude_tools: Annotated[list[ToolName], Field(max_length=limits.MAX_TOOLS)] | None = None
    # True: every cleared call's input too; a list: only those tools' inputs.
    clear_tool_inputs: (
        Annotated[bool, Field(strict=True)]
        | Annotated[list[ToolName], Field(max_length=limits.MAX_TOOLS)]
        | None
    ) = None

    def clears_input_of(self, tool: str) -> bool:
        """Whether a cleared use of `tool` also loses its input."""
        if isinstance(self.clear_tool_inputs, list):
            return tool in self.clear_tool_inputs
        return bool(self.clear_tool_inputs)

    def excludes(self, tool: str) -> bool:
        return tool in (self.exclude_tools or ())


# --- clear_thinking_20251015 ----------------------------------------------------------------


class ThinkingTurns(_Wire):
    type: Literal["thinking_turns"]
    value: Count


class AllThinkingTurns(_Wire):
    type: Literal["all"]


class ClearThinkingEdit(_Wire):
    """Drop the thinking of all but the most recent `keep` assistant turns that have some."""

    type: Literal["clear_thinking_20251015"]
    keep: Literal["all"] | Annotated[ThinkingTurns | AllThinkingTurns, Discriminator("type")] = (
        Field(default_factory=lambda: ThinkingTurns(type="thinking_turns", value=1))
    )

    @property
    def kept_turns(self) -> int | None:
        """How many recent thinking turns stay; None: all of them."""
        return self.keep.value if isinstance(self.keep, ThinkingTurns) else None


class CompactEdit(_Wire):
    type: Literal["compact_20260112"]

    @model_validator(mode="before")
    @classmethod
    def _not_served(cls, value: Any) -> Any:
        raise ValueError(
            "compact_20260112 (server-side compaction) is not supported by this server; "
            "use clear_tool_uses_20250919, or compact on the client"
        )


ContextEdit = Annotated[ClearToolUsesEdit | ClearThinkingEdit | CompactEdit, Discriminator("type")]


class ContextManagement(_Wire):
    """The request's `context_management`: edits, applied in the order given."""

    edits: Annotated[list[ContextEdit], Field(max_length=16)] = Field(default_factory=list)

    @model_validator(mode="after")
    def _each_type_once(self) -> ContextManagement:
        seen: set[str] = set()
        for index, edit in enumerate(self.edits):
            if edit.type in seen:
                raise ValueError(f"edits.{index}: {edit.type} appears more than once")
            seen.add(edit.type)
        return self


# --- the answer -----------------------------------------------------------------------------


class ClearedToolUses(BaseModel):
    type: Literal["clear_tool_uses_20250919"] = "clear_tool_uses_20250919"
    cleared_tool_uses: int
    cleared_input_tokens: int


class ClearedThinking(BaseModel):
    type: Literal["clear_thinking_20251015"] = "clear_thinking_20251015"
    cleared_thinking_turns: int
    cleared_input_tokens: int


AppliedEdit = Annotated[ClearedToolUses | ClearedThinking, Discriminator("type")]


class ContextManagementResponse(BaseModel):
    """What the edits cleared (non-streaming: top level; streaming: on `message_delta`)."""

    applied_edits: list[AppliedEdit] = Field(default_factory=list)


class CountTokensContextManagement(BaseModel):
    """`count_tokens`'s answer beside the edited `input_tokens`: the count before editing."""

    original_input_tokens: int
