"""One rank's view of a cluster: who it is, and the two things ranks exchange beyond the
model's own collectives — rank 0's decisions (pickled, through `all_sum`, as mlx-lm's server
shares its requests) and agreed numbers (`all_min`).

A peer that dies or becomes unreachable makes the next collective raise (the ring backend:
"connection to a peer was lost"); `ClusterLost` is that, named.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generation_stream

from mlxlaunch.engine.types import ClusterLost

# Bytes of the one collective that carries most of rank 0's messages (see `_share`).
FRAME_BYTES = 512


class RankGroup:
    """`mx.distributed` group of this process, with rank 0 as the one that decides."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.rank = int(group.rank())
        self.size = int(group.size())

    @classmethod
    def joined(cls) -> RankGroup:
        """This process's group as `mlx.launch` set it up (MLX_RANK, MLX_HOSTFILE)."""
        return cls(mx.distributed.init(strict=True))

    @property
    def leads(self) -> bool:
        return self.rank == 0

    def share(self, message: Any = None) -> Any:
        """Rank 0: send `message` to every rank (and return it); others: receive and return
        rank 0's. Blocks until every rank has called it.

        Raises:
            ClusterLost: a rank is gone.
        """
        try:
            with mx.stream(generation_stream):  # in order with the batch's collectives
                return self._share(message)
        except RuntimeError as exc:
            raise lost(exc) from exc

    def _share(self, message: Any) -> Any:
        # One collective for what fits a frame (every step's message does), a second for
        # the rest of a longer one (a prompt's token ids); its length leads the frame.
        if self.leads:
            payload = pickle.dumps(message, protocol=5)
            data = np.frombuffer(len(payload).to_bytes(4, "little") + payload, dtype=np.uint8)
            first = np.zeros(FRAME_BYTES, dtype=np.uint8)
            first[: min(data.size, FRAME_BYTES)] = data[:FRAME_BYTES]
            mx.eval(mx.distributed.all_sum(mx.array(first), group=self.group))
            if data.size > FRAME_BYTES:
                rest = mx.array(data[FRAME_BYTES:])
                mx.eval(mx.distributed.all_sum(rest, group=self.group))
            return message
        empty = mx.zeros((FRAME_BYTES,), dtype=mx.uint8)
        frame = np.array(mx.distributed.all_sum(empty, group=self.group)).tobytes()
        size = int.from_bytes(frame[:4], "little")
        payload = frame[4 : 4 + size]
        if 4 + size > FRAME_BYTES:
            rest = mx.zeros((4 + size - FRAME_BYTES,), dtype=mx.uint8)
            payload += np.array(mx.distributed.all_sum(rest, group=self.group)).tobytes()
        # Rank 0 of this same program sent them, over the connections set up at start.
        return pickle.loads(payload)

    def agree_min(self, value: int) -> int:
        """The smallest `value` any rank passes (every rank gets the same answer)."""
        try:
            with mx.stream(generation_stream):
                agreed = mx.distributed.all_min(mx.array([int(value)]), group=self.group)
                return int(np.array(agreed)[0])
        except RuntimeError as exc:
            raise lost(exc) from exc

    def gather_text(self, text: str, width: int = 256) -> list[str]:
        """Every rank's `text` (cut to `width` bytes), in rank order, on every rank."""
        raw = text.encode("utf-8")[:width].ljust(width, b"\0")
        try:
            with mx.stream(generation_stream):
                mine = mx.array(np.frombuffer(raw, dtype=np.uint8))[None]
                gathered = mx.distributed.all_gather(mine, group=self.group)
                mx.eval(gathered)
        except RuntimeError as exc:
            raise lost(exc) from exc
        rows = np.array(gathered).tobytes()
        return [
            rows[i * width : (i + 1) * width].rstrip(b"\0").decode("utf-8", "replace")
            for i in range(self.size)
        ]

    def leader_tokens(
        self, sampled: mx.array | None, like: mx.array, after: Sequence[mx.array] = ()
    ) -> mx.array:
        """The tokens rank 0 sampled, on every rank: rank 0 passes its own, the others None
        (they contribute zeros shaped by `like`, the step's logprobs). Lazy: the collective
        runs when the tokens are evaluated, in the same place on every rank.

        MLX evaluates a graph in dependency order, so the collective must come after the
        forward pass's own collectives on every rank: the zeros are computed from the
        logprobs, and rank 0's tokens are made to depend on `after`, the step's raw logits,
        which a logits processor that forces a token (scripted output, a budget's end) cuts
        out of what its tokens depend on.
        """
        if self.leads:
            assert sampled is not None
            mine = sampled.astype(mx.int32)
            for logits in after:
                mine = mine + (mx.argmax(logits, axis=-1).astype(mx.int32) * 0).sum()
        else:
            mine = mx.argmax(like, axis=-1).astype(mx.int32) * 0
        return mx.distributed.all_sum(mine, group=self.group)


def lost(exc: BaseException) -> ClusterLost:
    return ClusterLost(f"a rank of the cluster is gone ({exc})")
