"""Captured Claude Code prompt data shipped with the benchmark."""
