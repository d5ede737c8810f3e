"""engine/runtime/freed_memory.py: freed buffers reused without page faults, handed back on release.

Each case runs in a fresh process: the allocator's settings are process-wide.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="the settings are glibc's",
)

# A request's worth of buffers (four 3.3 MB ones), freed and MLX's cache emptied as mlx-lm does
# after a prefill chunk, then the same sizes again: page faults of the second round.
_SCRIPT = """
import resource, sys
from mlxlaunch.engine.runtime import freed_memory
if sys.argv[1] == "keep":
    assert freed_memory.keep()
import mlx.core as mx

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def rss_kib():
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) for l in status if l.startswith("VmRSS:"))

def round_():
    arrays = [mx.ones((1, 2, 12_800, 32)) + i for i in range(4)]
    mx.eval(arrays)
    del arrays
    mx.clear_cache()

round_()
before = faults()
round_()
second = faults() - before
# Many blocks at once, then freed: what release hands back.
held = [mx.ones((1 << 20,)) + i for i in range(48)]
mx.eval(held)
del held
mx.clear_cache()
rss = rss_kib()
released = freed_memory.release()
print(second, rss - rss_kib(), released)
"""


def run(mode: str) -> tuple[int, int, bool]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SCRIPT), mode],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    faults, freed_kib, released = done.stdout.split()
    return int(faults), int(freed_kib), released == "True"


@pytest.mark.slow
def test_kept_blocks_are_reused_without_page_faults_and_released_when_asked() -> None:
    faults, freed_kib, released = run("keep")
    default_faults, _, _ = run("default")
    # 13 MB of buffers is ~3.2k pages: the default faults most of them in again.
    assert default_faults > 2000
    assert faults < 200
    # 48 blocks of 4 MiB were free in the heap; release gives (most of) them back.
    assert released and freed_kib > 100 * 1024
