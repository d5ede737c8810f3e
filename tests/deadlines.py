"""Deadlines for tests that wait on real processes and servers.

They are generous on purpose: CI and developers share 2-core machines with other work, where a
process can be starved for many seconds. A deadline only has to catch a hang, never to measure
speed; speed belongs to `mlx bench` and to tests that compare ratios.
"""

from __future__ import annotations

# A child process (`mlx serve`, `mlx launch`, a stand-in claude) to exit after it was told to.
PROCESS_EXIT_S = 90.0
# A server process to start and announce itself (a test model builds on first use).
PROCESS_START_S = 180.0
