"""consensus_lease.shard.shard_for: stable, even, minimal movement, checked input."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import consensus_lease
from consensus_lease.errors import InvalidArgument
from consensus_lease.shard import shard_for

SHARDS = [f"etcd://shard{i}-a:2379,shard{i}-b:2379,shard{i}-c:2379/jobs" for i in range(1, 5)]
KEYS = [f"queue-{i}" for i in range(10_000)]
PACKAGE_ROOT = str(Path(consensus_lease.__file__).resolve().parents[1])


def test_known_answers_are_pinned() -> None:
    """The mapping is part of every deployment's data layout: a change of the hash would
    move every queue to another shard. These answers must never change."""
    urls = [f"etcd://shard{i}:2379/jobs" for i in range(1, 5)]
    got = {k: urls.index(shard_for(k, urls)) for k in
           ["invoices", "emails", "q-0", "q-1", "q-2", "q-3", "job-42", "é"]}
    assert got == {"invoices": 1, "emails": 0, "q-0": 3, "q-1": 2, "q-2": 0, "q-3": 3,
                   "job-42": 1, "é": 2}


def _in_fresh_interpreter(seed: str) -> Any:
    code = textwrap.dedent(f"""
        import json
        from consensus_lease.shard import shard_for
        urls = {SHARDS!r}
        print(json.dumps([shard_for(f"queue-{{i}}", urls) for i in range(500)]))
    """)
    env = {**os.environ, "PYTHONHASHSEED": seed,
           "PYTHONPATH": os.pathsep.join(filter(None, [PACKAGE_ROOT,
                                                       os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env, check=True)
    return json.loads(done.stdout)


def test_same_key_same_shard_across_processes_and_hash_seeds() -> None:
    here = [shard_for(k, SHARDS) for k in KEYS[:500]]
    assert _in_fresh_interpreter("1") == here
    assert _in_fresh_interpreter("2") == here  # not Python's salted hash()


def test_order_of_the_urls_does_not_matter() -> None:
    backwards = list(reversed(SHARDS))
    assert all(shard_for(k, SHARDS) == shard_for(k, backwards) for k in KEYS[:2_000])


def test_keys_spread_evenly_over_four_shards() -> None:
    counts = collections.Counter(shard_for(k, SHARDS) for k in KEYS)
    assert set(counts) == set(SHARDS)
    # 2,500 expected each; the binomial's standard deviation is ~43: 4.6 sigma margin
    assert all(2_300 <= n <= 2_700 for n in counts.values()), counts


def test_adding_a_shard_moves_only_what_the_new_shard_takes() -> None:
    new = "etcd://shard5:2379/jobs"
    before = {k: shard_for(k, SHARDS) for k in KEYS}
    after = {k: shard_for(k, [*SHARDS, new]) for k in KEYS}
    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(after[k] == new for k in moved)  # nothing moves between old shards
    assert 1_700 <= len(moved) <= 2_300  # ~1/5 of the keys


def test_removing_a_shard_moves_only_its_own_keys() -> None:
    gone = SHARDS[1]
    before = {k: shard_for(k, SHARDS) for k in KEYS}
    rest = [u for u in SHARDS if u != gone]
    for k in KEYS:
        if before[k] != gone:
            assert shard_for(k, rest) == before[k]


def test_one_shard_takes_everything() -> None:
    assert {shard_for(k, SHARDS[:1]) for k in KEYS[:100]} == {SHARDS[0]}


@pytest.mark.parametrize(
    ("key", "urls", "message"),
    [
        ("", SHARDS, "non-empty str"),
        (42, SHARDS, "non-empty str"),
        (None, SHARDS, "non-empty str"),
        ("q", [], "urls is empty"),
        ("q", "etcd://h:2379/jobs", "sequence of store URLs"),
        ("q", {"etcd://h:2379/a"}, "sequence of store URLs"),
        ("q", [SHARDS[0], SHARDS[0]], "listed twice"),
        ("q", [SHARDS[0], ""], "non-empty str"),
        ("q", [SHARDS[0], b"etcd://h:2379/a"], "non-empty str"),
    ],
)
def test_bad_input_is_invalid_argument(key: Any, urls: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        shard_for(key, urls)
