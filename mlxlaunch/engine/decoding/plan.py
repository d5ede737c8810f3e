"""What shapes one request's decoding: grammar constraints and the thinking budget.

`plan_decoding` runs at submit time, on the caller's side of the engine, so a schema or tool
choice that cannot be honoured is refused (InvalidRequest, a 400) before the request is admitted.
The resulting `DecodingPlan` is kept on the job; the worker asks it for fresh logits processors
when the sequence joins the batch (processors hold per-sequence state and are never shared).

Which constraint applies, in order:
1. `tool_choice` any / tool: the output is a tool call (of that tool) in the model's own markup;
2. a response schema (`output_config.format`): the text is one JSON value matching it;
3. `tool_choice` auto with `strict` tools: free text, but calls of strict tools match their
   schema (skipped, not refused, when the model's tool syntax has no grammar: strict is a
   guarantee we can only give for the families `tool_grammar` covers). A freeform tool with a
   grammar is strict: its input follows the grammar (`input_grammar`).
The thinking budget applies on top of any of them.

Planning runs on a thread of its own (`Engine._plan_decoding`) and holds the engine's tokenizer
lock only for the tokenizer calls it makes (a few markup encodings, remembered per tokenizer):
compiling and warming a grammar can take tens of milliseconds and must not stall other
requests' rendering or the worker's detokenizing. Inputs are bounded first (`schema_limits`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxlaunch.engine.decoding.grammar import (
    GrammarConstraint,
    GrammarLogitsProcessor,
    JsonConstraint,
    encode_markup,
    guarding_tokenizer,
)
from mlxlaunch.engine.decoding.harmony_grammar import (
    harmony_schema_constraint,
    harmony_tool_constraint,
)
from mlxlaunch.engine.decoding.input_grammar import check_input_grammar
from mlxlaunch.engine.decoding.schema_limits import check_grammar_inputs
from mlxlaunch.engine.decoding.thinking import ThinkingBudget
from mlxlaunch.engine.decoding.tool_grammar import supported_families, tool_call_constraint
from mlxlaunch.engine.types import GenerationRequest, InvalidRequest, ModelInfo, ToolSpec

log = logging.getLogger(__name__)

# Where plans are built (Engine._plan_decoding): threads of their own, so a burst of grammar
# compilations waits here instead of in the default executor that prompt rendering uses.
# llguidance drops the GIL while it compiles and computes masks, so these run in parallel
# with the event loop and the worker.
PLANNING_THREADS = concurrent.futures.ThreadPoolExecutor(
    max_workers=2, thread_name_prefix="mlxlaunch-plan"
)


@dataclass(frozen=True)
class BudgetSpec:
    """A thinking budget and the marker token ids it watches."""

    budget: int
    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    starts_inside: bool


@dataclass(frozen=True)
class DecodingPlan:
    """The per-request decoding rules; `processors()` instantiates them for one sequence.

    A plan belongs to one request (one job): it remembers the grammar processor it handed out
    last, so the worker can ask `check()` whether the grammar broke down mid-generation.
    """

    constraint: GrammarConstraint | None = None
    thinking_budget: BudgetSpec | None = None
    _live: list[GrammarLogitsProcessor] = field(
        default_factory=list, init=False, compare=False, repr=False
    )

    def processors(self) -> list[Any]:
        """Fresh mlx-lm logits processors for one sequence (budget first, then grammar)."""
        out: list[Any] = []
        spec = self.thinking_budget
        if spec is not None:
            out.append(
                ThinkingBudget(spec.budget, spec.start_ids, spec.end_ids, inside=spec.starts_inside)
            )
        if self.constraint is not None:
            grammar = self.constraint.logits_processor()
            self._live[:] = [grammar]
            out.append(grammar)
        return out

    def check(self) -> None:
        """Raise when the sequence's grammar could not follow it (a limit of the grammar
        engine hit mid-generation): the output may not match, so the request must fail.

        Raises:
            ConstraintBroken: a `GenerationFailed`, with the grammar engine's reason.
        """
        for grammar in self._live:
            grammar.check()

    @property
    def constrained(self) -> bool:
        return self.constraint is not None


NO_PLAN = DecodingPlan()


def needs_plan(request: GenerationRequest) -> bool:
    """Whether `request` asks for anything `plan_decoding` would build (cheap to check)."""
    return (
        request.tool_choice.mode in ("any", "tool")
        or request.response_schema is not None
        or any(t.strict for t in request.tools)
        or (request.thinking and request.thinking_budget is not None)
    )


def plan_decoding(
    request: GenerationRequest,
    *,
    opens_thinking: bool,
    tokenizer: TokenizerWrapper,
    info: ModelInfo,
    lock: threading.Lock | None = None,
) -> DecodingPlan:
    """Build (and compile) the decoding rules of `request`.

    Args:
        request: the engine request.
        opens_thinking: the rendered prompt ends inside an open think span.
        tokenizer: the loaded model's tokenizer (grammars compile against it).
        info: the loaded model's facts (tool syntax, think markers).
        lock: held around tokenizer use (the engine's tokenizer lock).

    Raises:
        InvalidRequest: a schema that cannot be compiled, too large or complex to honour
            (naming the field), or a forced tool choice the model's tool syntax cannot be
            constrained to.
    """
    with guarding_tokenizer(lock):
        try:
            constraint = _constraint(request, opens_thinking, tokenizer, info)
        except ValueError as exc:  # grammar construction rejects what the client sent
            raise InvalidRequest(f"cannot constrain output: {exc}") from exc
        return DecodingPlan(
            constraint=constraint,
            thinking_budget=_budget(request, opens_thinking, tokenizer, info),
        )


def _grammar_inputs(request: GenerationRequest) -> Iterator[tuple[str, Any]]:
    """The schemas a constraint for `request` would be built from, named as the client
    named them (a superset: a schema the chosen constraint skips is still bounded)."""
    choice = request.tool_choice
    forced = choice.mode in ("any", "tool")
    if request.response_schema is not None:
        yield request.schema_field, request.response_schema
    if choice.mode == "none":
        return
    tools: list[ToolSpec] = list(request.tools)
    if choice.mode == "tool":
        tools = [t for t in tools if t.name == choice.name]
    elif not forced:
        tools = [t for t in tools if t.strict]
    for tool in tools:
        yield f"tools[{tool.name!r}].{request.tool_schema_field}", tool.parameters


def _constraint(
    request: GenerationRequest,
    opens_thinking: bool,
    tokenizer: TokenizerWrapper,
    info: ModelInfo,
) -> GrammarConstraint | None:
    check_grammar_inputs(_grammar_inputs(request))
    for tool in request.tools:  # every one: a broken grammar is a 400 whatever the model
        if tool.grammar is not None:
            check_input_grammar(tool.grammar)
    think_end = info.think_end if opens_thinking else None
    choice = request.tool_choice
    family = info.tool_format or ""
    if info.dialect is not None and info.dialect.channels:
        return _harmony_constraint(request, tokenizer)
    forced = choice.mode in ("any", "tool")
    if not forced and request.response_schema is not None:
        return JsonConstraint.from_schema(
            tokenizer, request.response_schema, think_end=think_end, think=request.thinking
        )
    strict = choice.mode == "auto" and any(t.strict for t in request.tools)
    if not (forced or strict):
        return None
    if not forced and family not in supported_families():
        log.info("strict tools not enforced: no tool-call grammar for %r", family)
        return None
    return tool_call_constraint(
        tokenizer,
        request.tools,
        choice,
        family=family,
        think_end=think_end,
        think=request.thinking,
        dialect=info.dialect,
    )


def _harmony_constraint(
    request: GenerationRequest, tokenizer: TokenizerWrapper
) -> GrammarConstraint | None:
    """Harmony (gpt-oss) writes calls and answers as channel messages: its own grammars."""
    choice = request.tool_choice
    strict = choice.mode == "auto" and any(t.strict for t in request.tools)
    if choice.mode in ("any", "tool") or strict:
        return harmony_tool_constraint(tokenizer, request.tools, choice, analysis=request.thinking)
    if request.response_schema is not None:
        return harmony_schema_constraint(
            tokenizer, request.response_schema, analysis=request.thinking
        )
    return None


def _budget(
    request: GenerationRequest,
    opens_thinking: bool,
    tokenizer: TokenizerWrapper,
    info: ModelInfo,
) -> BudgetSpec | None:
    budget = request.thinking_budget
    if not request.thinking or budget is None or not (info.think_start and info.think_end):
        return None
    start = encode_markup(tokenizer, info.think_start)
    end = encode_markup(tokenizer, info.think_end)
    if not start or not end:
        return None
    return BudgetSpec(max(1, budget), start, end, opens_thinking)
