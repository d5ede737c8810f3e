"""Captured agent requests shipped with the benchmark: Claude Code's prompt, Codex CLI's session."""
