"""The output parser with span readers: streamed calls, committed spans, leading calls."""

from __future__ import annotations

import json

from mlxlaunch.engine.output.parser import (
    INCOMPLETE_KEY,
    INCOMPLETE_NOTE,
    OutputParser,
    ParsedEvent,
    ParserConfig,
    flag_incomplete,
)
from mlxlaunch.engine.output.spans import (
    BufferedReader,
    CallArgs,
    CallBegin,
    CallEnd,
    CallPiece,
    ParsedCall,
)
from mlxlaunch.engine.tool_ids import model_written_id
from mlxlaunch.engine.types import TextDelta, ToolCallEvent, ToolCallStart, ToolInputDelta


class NameColonJson:
    """A toy streaming format: `NAME:{json}`; the name is known at the colon."""

    def __init__(self) -> None:
        self.committed = False
        self._head = ""
        self._args: list[str] = []

    def feed(self, text: str) -> list[CallPiece]:
        if self.committed:
            self._args.append(text)
            return [CallArgs(text)]
        self._head += text
        if ":" not in self._head:
            return []
        name, rest = self._head.split(":", 1)
        self.committed = True
        self._args.append(rest)
        return [CallBegin(name.strip(), model_id=f"id-{name.strip()}"), CallArgs(rest)]

    def close(self, complete: bool) -> list[CallPiece] | None:
        if not self.committed:
            return None
        text = "".join(self._args)
        return [CallEnd(text)] if complete else [CallEnd(text + '"}', complete=False)]


def run(config: ParserConfig, pieces: list[str]) -> tuple[list[ParsedEvent], OutputParser]:
    parser = OutputParser(config)
    events: list[ParsedEvent] = []
    for piece in pieces:
        events += parser.feed(piece)
    return events + parser.finish(), parser


def streaming(**kw: object) -> ParserConfig:
    return ParserConfig(
        tool_call_start="<call>", tool_call_end="</call>", span_reader=NameColonJson, **kw
    )


def test_a_streamed_call_is_announced_then_arrives_in_pieces() -> None:
    text = 'Sure.<call>Write:{"path": "a.txt", "content": "hi"}</call>'
    events, _ = run(streaming(), list(text))
    calls = [e for e in events if not isinstance(e, TextDelta)]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Sure."
    start = calls[0]
    assert isinstance(start, ToolCallStart) and start.name == "Write"
    assert model_written_id(start.id) == "id-Write"  # the model's id travels in the toolu id
    deltas = [e.partial_json for e in events if isinstance(e, ToolInputDelta)]
    assert len(deltas) > 10  # piece by piece, not at the end
    end = calls[-1]
    assert isinstance(end, ToolCallEvent) and end.id == start.id
    assert "".join(deltas) == end.arguments
    assert json.loads(end.arguments) == {"path": "a.txt", "content": "hi"}


def test_a_committed_call_cut_off_is_ended_and_flagged_not_turned_into_text() -> None:
    events, _ = run(streaming(), ['<call>Write:{"content": "half'])
    assert not any(isinstance(e, TextDelta) for e in events)
    end = events[-1]
    assert isinstance(end, ToolCallEvent)
    # The client's schema check refuses it (no extra keys) rather than writing half a file.
    assert json.loads(end.arguments) == {"content": "half", INCOMPLETE_KEY: INCOMPLETE_NOTE}
    deltas = "".join(e.partial_json for e in events if isinstance(e, ToolInputDelta))
    assert deltas == end.arguments


def test_flagging_an_empty_object() -> None:
    assert json.loads(flag_incomplete("{ }")) == {INCOMPLETE_KEY: INCOMPLETE_NOTE}


def test_an_uncommitted_span_stays_text() -> None:
    events, _ = run(streaming(), ["<call>no colon here</call> after"])
    assert events == [TextDelta("<call>no colon here</call> after")]


def test_the_call_limit_stops_a_stream() -> None:
    events, parser = run(streaming(max_tool_calls=1), ["<call>A:{}</call><call>B:{}</call>"])
    assert [e.name for e in events if isinstance(e, ToolCallEvent)] == ["A"]
    assert parser.tool_limit_reached and parser.done


def whole(body: str) -> list[ParsedCall] | None:
    data = json.loads(body)
    return [ParsedCall(data["name"], json.dumps(data["parameters"]))]


def leading(**kw: object) -> ParserConfig:
    return ParserConfig(
        tool_call_start="<|python_tag|>",
        tool_call_end="",
        leading_call="{",
        span_reader=lambda: BufferedReader(whole),
        **kw,
    )


def test_an_output_that_starts_as_a_call_is_one() -> None:
    for pieces in (
        ['  {"name": "Bash", "parameters": {"command": "ls"}}'],
        list(' {"name": "Bash", "parameters": {}}'),
    ):
        events, _ = run(leading(), pieces)
        assert len(events) == 1 and isinstance(events[0], ToolCallEvent)
        assert events[0].name == "Bash"


def test_json_later_in_prose_is_text() -> None:
    events, _ = run(leading(), ['Use {"name": "x"} like this.'])
    assert events == [TextDelta('Use {"name": "x"} like this.')]


def test_a_whole_span_call_arrives_without_an_announcement() -> None:
    events, _ = run(leading(), ['<|python_tag|>{"name": "Bash", "parameters": {"command": "ls"}}'])
    assert [type(e) for e in events] == [ToolCallEvent]


def test_a_repeated_model_id_gets_a_fresh_client_id() -> None:
    class SameId(NameColonJson):
        def feed(self, text: str) -> list[CallPiece]:
            return [
                CallBegin(p.name, "same") if isinstance(p, CallBegin) else p
                for p in super().feed(text)
            ]

    config = ParserConfig(tool_call_start="<call>", tool_call_end="</call>", span_reader=SameId)
    events, _ = run(config, ["<call>A:{}</call><call>B:{}</call>"])
    ids = [e.id for e in events if isinstance(e, ToolCallEvent)]
    assert len(ids) == 2 and len(set(ids)) == 2


def test_a_name_that_differs_only_in_case_is_the_declared_tool() -> None:
    """Robustness II, item 11: `bash` written for a client whose tool is `Bash`."""
    from mlxlaunch.engine.output.parser import declared_name
    from mlxlaunch.engine.types import ToolSpec

    tools = [ToolSpec("Bash", "", {}), ToolSpec("Read", "", {})]
    config = ParserConfig(
        tool_call_start="<call>", tool_call_end="</call>", span_reader=NameColonJson, tools=tools
    )
    events, _ = run(config, ["<call>bash:{}</call>"])
    assert [e.name for e in events if isinstance(e, ToolCallEvent)] == ["Bash"]
    assert declared_name("Unknown", tools) == "Unknown"  # still emitted: the client says why
    ambiguous = [ToolSpec("bash", "", {}), ToolSpec("BASH", "", {})]
    assert declared_name("Bash", ambiguous) == "Bash"
