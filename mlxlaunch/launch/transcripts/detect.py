"""Which agent wrote a transcript, told from its records, and the reader for it."""

from __future__ import annotations

from pathlib import Path

from mlxlaunch.launch.transcripts.claude import is_claude_record, read_claude
from mlxlaunch.launch.transcripts.codex import is_codex_record, read_codex
from mlxlaunch.launch.transcripts.records import Transcript, TranscriptError, read_records


def read_transcript(path: Path) -> Transcript:
    """The session recorded in `path`, a Claude Code transcript or a Codex rollout.

    Raises:
        TranscriptError: the file cannot be read, is neither agent's, or holds no
            conversation.
    """
    path = Path(path)
    if path.is_dir():
        raise TranscriptError(path, "is a directory, not a session's .jsonl file")
    records = read_records(path)
    if any(is_codex_record(r) for r in records[:20]):
        return read_codex(path, records)
    if any(is_claude_record(r) for r in records):
        return read_claude(path, records)
    raise TranscriptError(
        path, "neither a Claude Code transcript nor a Codex rollout (no records of either)"
    )
