"""What KV quantization (`--kv-bits`) costs and buys, measured on a model: figures, no verdicts.

    python -m mlxlaunch.engine.scheduling.kv_figures --model DIR [--prompt 2048] [--decode 128]

(DIR: a model directory; a test model's is printed by `mlx models info large --json`.)

For unquantized, 8-bit and 4-bit KV: the bytes one token's KV takes, how long greedy decoding
agrees with the unquantized KV (tokens until the first different token, with the reference
tokens fed back so every step sees the same context; the logits' largest and mean absolute
error against the unquantized ones), prefill and decode speed through the engine's own batch
(`scheduling/batch.py`), and the longest session a memory budget holds. It prints; nothing
is asserted (times depend on the machine and what else runs on it).
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxlaunch.engine.runtime.quantized_kv import KVQuantization, head_dim, new_caches, resolve
from mlxlaunch.engine.scheduling.batch import Batch

PRECISIONS: tuple[int | None, ...] = (None, 8, 4)
MIB = 1024**2


@dataclass(frozen=True)
class KVFigures:
    """One precision's figures."""

    bits: int  # 16: unquantized
    bytes_per_token: float
    agreement: int  # greedy tokens equal to the unquantized ones before the first difference
    compared: int  # tokens compared
    max_logit_error: float
    mean_logit_error: float
    prefill_tps: float
    decode_tps: float

    def tokens_in(self, budget_bytes: int) -> int:
        """The longest context whose KV `budget_bytes` holds."""
        return int(budget_bytes // self.bytes_per_token)


def held_bytes(caches: list[Any]) -> int:
    """Bytes of the KV the caches hold: their keys and values up to their positions (not the
    spare room their buffers grow by)."""
    total = 0
    for cache in caches:
        used = int(cache.offset)
        leaves: Any = tree_flatten((cache.keys, cache.values))
        total += sum(a[..., :used, :].nbytes for _, a in leaves)
    return int(total)


def teacher_forced(
    model: Any, prompt: list[int], tokens: list[int], kv: KVQuantization | None
) -> list[mx.array]:
    """The logits after the prompt and after each of `tokens`, fed one by one."""
    caches = new_caches(model, kv)
    out = [model(mx.array([prompt]), cache=caches)[0, -1]]
    for token in tokens[:-1]:
        out.append(model(mx.array([[token]]), cache=caches)[0, -1])
    mx.eval(out)
    return out


def speeds(
    model: Any, prompt: list[int], decode: int, kv: KVQuantization | None
) -> tuple[float, float]:
    """Prefill and decode tokens per second of one sequence through the engine's batch."""
    batch = Batch(model, stop_tokens=(), width=1, prefill_chunk=512)
    batch.insert(prompt, max_tokens=decode, cache=new_caches(model, kv), held=[])
    done = False
    while not done:
        _, emitted = batch.step(512)
        done = any(e.finish_reason is not None for e in emitted)
    c = batch.counters
    prefill = c.prompt_tokens / c.prompt_time if c.prompt_time else 0.0
    decoded = c.generation_tokens / c.decode_time if c.decode_time else 0.0
    return prefill, decoded


def measure(
    model: Any, prompt_tokens: int = 2048, decode: int = 128, seed: int = 0
) -> list[KVFigures]:
    """Every precision's figures on `model` (a prompt of random ids, greedy decoding)."""
    vocab = int(model.args.vocab_size)
    rng = random.Random(seed)
    prompt = [rng.randrange(vocab) for _ in range(prompt_tokens)]
    # The unquantized greedy tokens: the reference every precision is fed.
    caches = new_caches(model, None)
    logits = model(mx.array([prompt]), cache=caches)[0, -1]
    reference: list[int] = []
    for _ in range(decode):
        token = int(_scalar(mx.argmax(logits)))
        reference.append(token)
        logits = model(mx.array([[token]]), cache=caches)[0, -1]
    exact = teacher_forced(model, prompt, reference, None)
    figures = []
    for bits in PRECISIONS:
        kv = resolve(bits, None, head_dim(model))
        sized = new_caches(model, kv)
        model(mx.array([prompt]), cache=sized)
        per_token = held_bytes(sized) / prompt_tokens
        got = teacher_forced(model, prompt, reference, kv) if kv else exact
        agree = 0
        while agree < decode and int(_scalar(mx.argmax(got[agree]))) == reference[agree]:
            agree += 1
        errors = [
            mx.abs(a.astype(mx.float32) - b.astype(mx.float32))
            for a, b in zip(got, exact, strict=True)
        ]
        worst = max(_scalar(e.max()) for e in errors)
        mean = sum(_scalar(e.mean()) for e in errors) / len(errors)
        prefill, decoded = speeds(model, prompt, decode, kv)
        figures.append(
            KVFigures(bits or 16, per_token, agree, decode, worst, mean, prefill, decoded)
        )
    return figures


def _scalar(x: mx.array) -> float:
    return float(cast(float, x.item()))


def report(figures: list[KVFigures], budget_bytes: int) -> str:
    lines = [
        f"{'KV':>6} {'bytes/token':>12} {'agree':>9} {'max |dlogit|':>13} {'mean':>8} "
        f"{'prefill tok/s':>14} {'decode tok/s':>13} {f'tokens in {budget_bytes // MIB} MiB':>18}"
    ]
    for f in figures:
        lines.append(
            f"{f.bits:>3}-bit {f.bytes_per_token:>12.0f} {f.agreement:>4}/{f.compared:<4} "
            f"{f.max_logit_error:>13.4f} {f.mean_logit_error:>8.4f} {f.prefill_tps:>14.0f} "
            f"{f.decode_tps:>13.1f} {f.tokens_in(budget_bytes):>18,}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model directory")
    parser.add_argument("--prompt", type=int, default=2048, help="prompt tokens")
    parser.add_argument("--decode", type=int, default=128, help="greedy tokens compared")
    parser.add_argument("--budget-mib", type=int, default=64, help="memory for the KV")
    args = parser.parse_args(argv)
    from mlx_lm import load

    model = load(args.model)[0]
    tic = time.perf_counter()
    figures = measure(model, args.prompt, args.decode)
    print(report(figures, args.budget_mib * MIB))
    print(f"({args.model}: {args.prompt}-token prompt, {time.perf_counter() - tic:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
