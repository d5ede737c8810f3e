"""Agents' own session transcripts, read back into the requests the agent sent.

Claude Code keeps `~/.claude/projects/<slug>/<session>.jsonl`, Codex CLI
`~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl`. `read_transcript` tells them apart and
rebuilds, turn by turn, each request body as the agent's API carries it (`records.Transcript`);
`mlx bench --replay` sends those, `mlx launch … --resume` prefills the last one. Read only:
nothing here writes under an agent's home.
"""

from mlxlaunch.launch.transcripts.detect import read_transcript
from mlxlaunch.launch.transcripts.records import (
    Transcript,
    TranscriptError,
    TranscriptTurn,
)

__all__ = ["Transcript", "TranscriptError", "TranscriptTurn", "read_transcript"]
