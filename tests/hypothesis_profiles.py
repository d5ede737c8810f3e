"""How many examples the property tests try: a few while developing, the full count in CI.

`HYPOTHESIS_PROFILE` picks the profile (conftest.py loads it before any test module is
imported): `dev` (what `make test` sets) tries a tenth of each test's examples, `ci` (what
`make test-all` sets, and the default of a plain `pytest`) tries every one. A test names its
full count through `examples()`, so both profiles keep the proportions its author chose:

    @settings(max_examples=examples(300), deadline=None)
"""

from __future__ import annotations

import os

from hypothesis import settings

PROFILE_ENV = "HYPOTHESIS_PROFILE"
CI = "ci"
DEV = "dev"
# Hypothesis's own default count, the scale `examples()` divides by.
_FULL = 100
PROFILES = {CI: _FULL, DEV: _FULL // 10}


def load_profile() -> str:
    """Register both profiles and load the one `HYPOTHESIS_PROFILE` names (default: ci)."""
    for name, count in PROFILES.items():
        # No deadline: a shared machine's preemption (a 362 ms example against the default
        # 200 ms) is not a failure of the code, and tests here hold under load.
        settings.register_profile(name, max_examples=count, deadline=None)
    name = os.environ.get(PROFILE_ENV, CI)
    if name not in PROFILES:
        raise ValueError(f"{PROFILE_ENV}={name!r}: expected one of {sorted(PROFILES)}")
    settings.load_profile(name)
    return name


def examples(full: int) -> int:
    """`full` examples under the ci profile, proportionally fewer (at least 5) under dev."""
    return max(min(5, full), full * settings.default.max_examples // _FULL)
