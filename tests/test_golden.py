"""The golden builds (tests/golden.py) give exactly the recorded cycles and
package hashes: a change that moves them must update tests/golden_cycles.json
on purpose (`make golden`), so it shows in the diff."""

from __future__ import annotations

import json

from golden import CASES, FILE, key, measure


def test_golden_cycles_and_hashes() -> None:
    recorded = json.loads(FILE.read_text())
    assert sorted(recorded) == sorted(key(*c) for c in CASES)
    now = measure()
    changed = {k: (recorded[k], now[k]) for k in recorded if recorded[k] != now[k]}
    assert not changed, f"golden builds moved (run `make golden` if meant): {changed}"
