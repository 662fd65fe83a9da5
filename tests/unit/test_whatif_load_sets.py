"""The what-if validation's load sets: the in-sample script and the held-out one stay fixed.

The held-out set (scripts/bench/whatif_validate.py: held_out_rate, HELD_OUT_SEED) is what the
model was never tuned on; pinning its arrivals here makes a change to it (or to its seed) show
up as a failing test instead of a quietly moved baseline.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

from scripts.bench import whatif_validate as wv


def digest(times: list[float]) -> str:
    return hashlib.sha256(",".join(f"{t:.6f}" for t in times).encode()).hexdigest()[:16]


def test_the_in_sample_script_is_the_documented_one() -> None:
    assert len(wv.arrival_times(150.0, 1)) == 1221


def test_the_held_out_set_is_fixed_in_code() -> None:
    times = wv.arrival_times(150.0, wv.HELD_OUT_SEED, wv.HELD_OUT)
    assert wv.HELD_OUT_SEED == 3401
    assert len(times) == 1570
    assert times == wv.arrival_times(150.0, wv.HELD_OUT_SEED, wv.HELD_OUT)
    assert digest(times) == "9c6cc2bc8cd5d98f"
    # the seed is not the run's --seed: the held-out set ignores it
    assert wv.load_seed(wv.HELD_OUT, 11) == wv.HELD_OUT_SEED
    assert wv.load_seed(wv.IN_SAMPLE, 11) == 11


def test_the_held_out_shape_differs_in_kind_mean_and_peak() -> None:
    xs = [i * 0.1 for i in range(1500)]
    tuned = [wv.load_rate(x, 150.0) for x in xs]
    held = [wv.held_out_rate(x, 150.0) for x in xs]
    assert max(held) > max(tuned) + 5  # 40/s spikes against a 30/s burst
    assert sum(held) / len(held) > 1.2 * sum(tuned) / len(tuned)  # mean 10.8/s against 8.1/s
    # no plateau in common: the two scripts agree on at most the idle seconds
    same = sum(1 for a, b in zip(tuned, held, strict=True) if a == b and a > 0)
    assert same == 0
    # the held-out script keeps changing (sinusoid, sawtooth) where the in-sample one holds
    # plateaus: it changes rate in most steps, the in-sample one in its ramp's 40 s only
    changes = [sum(a != b for a, b in itertools.pairwise(r)) for r in (tuned, held)]
    assert changes[1] > 2 * changes[0]


def test_older_keep_directories_read_as_in_sample(tmp_path: Path) -> None:
    doc = {"names": ["A"], "settle_s": 160.0, "series": {}, "window": [0, 160], "configs": {}}
    assert wv.arrivals_of(doc) == wv.arrival_times(150.0, 1)
    (tmp_path / "live.json").write_text(json.dumps(doc))
    assert wv.set_dirs(tmp_path) == {wv.IN_SAMPLE: tmp_path}
    both = tmp_path / "both"
    for s in (wv.IN_SAMPLE, wv.HELD_OUT):
        (both / s).mkdir(parents=True)
        (both / s / "live.json").write_text(json.dumps({**doc, "set": s}))
    assert wv.set_dirs(both) == {wv.IN_SAMPLE: both / wv.IN_SAMPLE, wv.HELD_OUT: both / wv.HELD_OUT}
