"""Statistics and the summary rows built from raw figures (no timing is asserted anywhere)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxlaunch.bench.clients import StreamTiming, on_anthropic_event, on_openai_event
from mlxlaunch.bench.stats import (
    decode_rate,
    decode_span_rate,
    intervals,
    percentile,
    speedup,
    spread,
    summarize,
    throughput,
)


def test_percentile_known_values():
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 3.0
    assert percentile(values, 100) == 5.0
    assert percentile(values, 90) == pytest.approx(4.6)
    assert percentile([7.0], 99) == 7.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # order of input does not matter


@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=50),
    st.floats(0, 100),
)
def test_percentile_agrees_with_numpy(values, p):
    assert percentile(values, p) == pytest.approx(float(np.percentile(values, p)), abs=1e-6)


def test_percentile_rejects_bad_input():
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_and_rates():
    summary = summarize([0.1, 0.2, 0.3, 0.4])
    assert summary["n"] == 4 and summary["min"] == 0.1 and summary["max"] == 0.4
    assert summary["mean"] == pytest.approx(0.25)
    assert summary["p50"] == pytest.approx(0.25)
    assert summarize([]) == {}
    assert intervals([0.0, 0.5, 1.5]) == [0.5, 1.0]
    assert decode_rate([1.0, 2.0, 3.0], 3) == pytest.approx(1.0)
    assert decode_rate([1.0], 1) is None
    assert throughput(10, 2.0) == 5.0
    assert throughput(0, 2.0) is None


def test_spread_is_min_median_max_of_the_figures_present():
    assert spread([3.0, None, 1.0, 2.0]) == {"min": 1.0, "median": 2.0, "max": 3.0}
    assert spread([4.0, 1.0]) == {"min": 1.0, "median": 2.5, "max": 4.0}
    assert spread([None]) == {} and spread([]) == {}


def test_decode_span_rate_leaves_prefill_out_and_spans_every_stream():
    # One stream: its own decode rate (the first token is prefill's).
    assert decode_span_rate([(3, [1.0, 2.0, 3.0])]) == decode_rate([1.0, 2.0, 3.0], 3)
    # Two streams, 5 and 3 tokens: 4 + 2 decoded tokens from the first token (0.5) to the
    # last (2.0), whichever stream they belong to.
    streams = [(5, [0.5, 1.0, 1.5, 1.8, 2.0]), (3, [1.0, 1.5, 1.9])]
    assert decode_span_rate(streams) == pytest.approx(6 / 1.5)
    # Output tokens count, not deltas: a server that sends 2 tokens per delta decoded 4.
    assert decode_span_rate([(5, [1.0, 2.0, 3.0])]) == pytest.approx(2.0)
    assert decode_span_rate([(1, [1.0])]) is None and decode_span_rate([]) is None
    assert decode_span_rate([(3, [1.0, 1.0])]) is None  # no time passed


def test_speedup_direction():
    assert speedup(1.0, 2.0, higher_is_better=False) == 2.0  # ours takes half the time
    assert speedup(300.0, 100.0, higher_is_better=True) == 3.0  # ours decodes 3x the tokens/s
    assert speedup(None, 1.0, higher_is_better=True) is None


def test_anthropic_stream_usage_and_first_delta():
    timing = StreamTiming()
    start = (
        '{"type":"message_start","message":{"usage":{"input_tokens":100,'
        '"cache_read_input_tokens":900,"cache_creation_input_tokens":0}}}'
    )
    on_anthropic_event("message_start", start, timing, 0.1)
    on_anthropic_event("ping", '{"type":"ping"}', timing, 0.2)
    assert timing.ttft_s is None  # neither message_start nor ping is a token
    delta = '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}}'
    on_anthropic_event("content_block_delta", delta, timing, 0.5)
    on_anthropic_event("content_block_delta", delta, timing, 0.6)
    on_anthropic_event(
        "message_delta", '{"type":"message_delta","delta":{},"usage":{"output_tokens":2}}',
        timing, 0.7,
    )  # fmt: skip
    assert (timing.prompt_tokens, timing.cached_tokens, timing.output_tokens) == (1000, 900, 2)
    assert timing.ttft_s == 0.5 and timing.token_times == [0.5, 0.6]


def test_openai_stream_usage_and_first_delta():
    timing = StreamTiming()
    on_openai_event("", '{"choices":[{"delta":{"role":"assistant","content":""}}]}', timing, 0.1)
    assert timing.ttft_s is None
    on_openai_event("", '{"choices":[{"delta":{"content":"hi"}}]}', timing, 0.3)
    usage = (
        '{"choices":[],"usage":{"prompt_tokens":50,"completion_tokens":4,'
        '"prompt_tokens_details":{"cached_tokens":40}}}'
    )
    on_openai_event("", usage, timing, 0.4)
    on_openai_event("", "[DONE]", timing, 0.5)
    assert (timing.prompt_tokens, timing.cached_tokens, timing.output_tokens) == (50, 40, 4)
    assert timing.ttft_s == 0.3
