"""The SQL fence (consensus_lease.fencing_sql) on SQLite and on a real PostgreSQL server.

PostgreSQL comes from ``CONSENSUS_LEASE_POSTGRES_URL`` (``eval "$(bash
scripts/start-postgres.sh)"`` starts one on loopback and exports it). Without it the
PostgreSQL cases are skipped with that reason — except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, select, text

import consensus_lease
from consensus_lease import FenceRejected, InvalidArgument
from consensus_lease.fencing import Fence, FenceOutcome
from consensus_lease.fencing_sql import FenceRetryable, SqlFence

POSTGRES_ENV = "CONSENSUS_LEASE_POSTGRES_URL"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def postgres_url_or_skip() -> str:
    """The PostgreSQL URL; skip (fail under CI=true) when none is configured."""
    url = os.environ.get(POSTGRES_ENV, "").strip()
    if not url:
        reason = (
            f"{POSTGRES_ENV} is not set: run `eval \"$(bash scripts/start-postgres.sh)\"` "
            "to start PostgreSQL on 127.0.0.1 and export it"
        )
        if _in_ci():
            pytest.fail(f"{reason} (CI=true: PostgreSQL tests must run)", pytrace=False)
        pytest.skip(reason)
    return url


@dataclass
class Db:
    kind: str
    url: str
    prefix: str

    def fence(self, **kwargs: object) -> SqlFence:
        return SqlFence(self.url, table_prefix=self.prefix, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Db]:
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    url = f"sqlite:///{tmp_path / 'fence.db'}" if request.param == "sqlite" else postgres_url_or_skip()
    yield Db(request.param, url, prefix)
    if request.param == "postgresql":
        cleanup = SqlFence(url, table_prefix=prefix, create_tables=False)
        cleanup.drop_tables()
        cleanup.close()


@pytest.fixture(params=["upsert", "lock"])
def fence(request: pytest.FixtureRequest, db: Db) -> Iterator[SqlFence]:
    f = db.fence(strategy=request.param)
    yield f
    f.close()


# -- the rule --------------------------------------------------------------------------


def test_accepts_equal_and_higher_rejects_lower(fence: SqlFence) -> None:
    assert fence.apply_now("job", 7, "step-1") is FenceOutcome.ACCEPTED
    assert fence.apply_now("job", 7, "step-2") is FenceOutcome.ACCEPTED
    assert fence.apply_now("job", 8, "step-1") is FenceOutcome.ACCEPTED
    with pytest.raises(FenceRejected) as rejected:
        fence.apply_now("job", 7, "step-3")
    assert rejected.value.highest_seen == 8 and rejected.value.generation == 7
    assert rejected.value.job_id == "job"
    assert fence.highest_token("job") == 8
    assert [(e.token, e.effect_id) for e in fence.effects("job")] == [
        (7, "step-1"), (7, "step-2"), (8, "step-1"),
    ]


def test_rejection_after_a_store_restore_names_bump_epoch(fence: SqlFence) -> None:
    highest = (2 << 32) + 1  # epoch 2
    fence.apply_now("job", highest, "x")
    with pytest.raises(FenceRejected) as rejected:
        fence.apply_now("job", (1 << 32) + 40, "y")  # epoch 1: restored from before a bump
    assert f"bump-epoch --backend URL --above {highest}" in str(rejected.value)
    assert rejected.value.highest_seen == highest
    fence.apply_now("job", highest + 1, "z")
    with pytest.raises(FenceRejected) as stale:
        fence.apply_now("job", highest, "w")
    assert "bump-epoch" not in str(stale.value)


def test_resources_are_independent_and_unknown_has_no_token(fence: SqlFence) -> None:
    fence.apply_now("a", 9, "x")
    assert fence.apply_now("b/ü 1", 1, "x") is FenceOutcome.ACCEPTED
    assert fence.highest_token("never") is None
    assert [e.resource for e in fence.effects()] == ["a", "b/ü 1"]


def test_idempotency_key_makes_a_retry_a_no_op(fence: SqlFence) -> None:
    assert fence.apply_now("job", 3, "charge", b"$10") is FenceOutcome.ACCEPTED
    assert fence.apply_now("job", 3, "charge", b"$10") is FenceOutcome.DUPLICATE
    fence.apply_now("job", 4, "charge")
    # A late retry at 3 after 4 was accepted: the token check comes first, as on
    # SqliteFence (the retrier no longer holds the job); nothing is recorded.
    with pytest.raises(FenceRejected):
        fence.apply_now("job", 3, "charge", b"$10")
    assert [(e.token, e.payload) for e in fence.effects()] == [(3, b"$10"), (4, b"")]


def test_rejected_effect_changes_nothing(fence: SqlFence) -> None:
    fence.apply_now("job", 5, "a")
    with pytest.raises(FenceRejected):
        fence.apply_now("job", 4, "b")
    assert [e.effect_id for e in fence.effects()] == ["a"]
    assert fence.highest_token("job") == 5


def test_unfenced_mode_lets_stale_tokens_through(db: Db) -> None:
    fence = db.fence(enforce_tokens=False)
    fence.apply_now("job", 5, "a")
    assert fence.apply_now("job", 4, "b") is FenceOutcome.ACCEPTED
    assert fence.highest_token("job") == 5  # still the maximum
    fence.close()


@pytest.mark.parametrize(
    ("resource", "token", "effect_id", "payload"),
    [("", 1, "e", b""), ("j", 0, "e", b""), ("j", True, "e", b""), ("j", 1, "", b""),
     ("j", 1, "x" * 257, b""), ("j", 1, "e", "text"), ("j\x00", 1, "e", b"")],
)
def test_bad_arguments_are_rejected_before_any_sql(
    fence: SqlFence, resource: str, token: int, effect_id: str, payload: bytes
) -> None:
    with pytest.raises(InvalidArgument):
        fence.apply_now(resource, token, effect_id, payload)
    assert fence.effects() == []


def test_effect_id_limit_is_the_sqlite_fences(fence: SqlFence) -> None:
    """SqliteFence's limit and error (one constant): 300 characters refused before any
    SQL, 256 (4-byte characters too) taken."""
    from consensus_lease.fencing import MAX_EFFECT_ID_CHARS

    assert MAX_EFFECT_ID_CHARS == 256
    for too_long in ("x" * 300, "\U0001f600" * 257):
        with pytest.raises(InvalidArgument, match="effect_id must be at most 256 characters"):
            fence.apply_now("job", 1, too_long)
    assert fence.effects() == [] and fence.highest_token("job") is None
    assert fence.apply_now("job", 1, "x" * 256) is FenceOutcome.ACCEPTED
    assert fence.apply_now("job", 1, "\U0001f600" * 256) is FenceOutcome.ACCEPTED


@pytest.mark.parametrize(("url", "part"), [
    ("postgresql+psycopg://u:s3cr3t%00x@127.0.0.1:1/db", "password"),
    ("postgresql+psycopg://u:s3cr3t@127.0.0.1:1/d%00b", "database"),
    ("postgresql+psycopg://u:s3cr3t@127.0.0.1:1/db?application_name=a%00b",
     "query option 'application_name'"),
    ("postgresql+psycopg://u:s3cr3t\udc80@127.0.0.1:1/db", "password"),
    ("sqlite:///{tmp}/a%00b.db", "database"),
])
def test_a_url_part_the_driver_cannot_carry_is_refused_before_connecting(
    url: str, part: str, tmp_path: Path
) -> None:
    """libpq stops reading its connection string at a NUL (the host, port or database
    after it replaced by its defaults); sqlite3 raises a bare ValueError. Port 1: a
    connection attempt would be BackendUnavailable, not InvalidArgument."""
    with pytest.raises(InvalidArgument, match=f"URL's {part}") as info:
        SqlFence(url.format(tmp=tmp_path))
    assert "s3cr3t" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_as_fence_is_the_plain_fence_protocol(fence: SqlFence) -> None:
    plain = fence.as_fence()
    assert plain.apply("job", 2, "a") is FenceOutcome.ACCEPTED
    with pytest.raises(FenceRejected):
        plain.apply("job", 1, "a")


# -- inside the caller's transaction ------------------------------------------------------


def _ledger(fence: SqlFence, prefix: str) -> Table:
    table = Table(f"{prefix}ledger", MetaData(), Column("id", Integer, primary_key=True),
                  Column("what", String(64), nullable=False))
    table.metadata.create_all(fence.engine)
    return table


def test_callers_own_write_commits_with_the_token_check(fence: SqlFence, db: Db) -> None:
    ledger = _ledger(fence, db.prefix)
    with fence.engine.begin() as conn:
        assert fence.apply("job", 2, "charge", conn=conn) is FenceOutcome.ACCEPTED
        conn.execute(ledger.insert().values(what="charged by 2"))
    with pytest.raises(FenceRejected), fence.engine.begin() as conn:
        conn.execute(ledger.insert().values(what="charged by 1"))  # before the check
        fence.apply("job", 1, "charge", conn=conn)
    with fence.engine.connect() as conn:
        assert conn.execute(select(ledger.c.what)).scalars().all() == ["charged by 2"]
    ledger.metadata.drop_all(fence.engine)


def test_the_earlier_argument_order_still_works_and_warns(fence: SqlFence) -> None:
    """apply(conn, resource, token, effect_id) was SqlFence's order before it took
    SqliteFence's (resource, token, effect_id, payload) with conn= (issue 31)."""
    with fence.engine.begin() as conn:
        with pytest.warns(DeprecationWarning, match="conn=conn"):
            assert fence.apply(conn, "job", 2, "charge") is FenceOutcome.ACCEPTED
        with pytest.warns(DeprecationWarning):
            outcome = fence.apply(conn, "job", 2, "charge", b"x", once_per_job=True)
        assert outcome is FenceOutcome.ALREADY_APPLIED
    for bad in ({}, {"conn": object()}):
        with pytest.raises(InvalidArgument, match="conn="):
            fence.apply("job", 3, "charge", **bad)  # type: ignore[call-overload]
    with fence.engine.begin() as conn, pytest.raises(InvalidArgument, match="given twice"):
        fence.apply("job", 3, "charge", b"", conn=conn, payload=b"")  # type: ignore[call-overload]
    assert [e.token for e in fence.effects("job")] == [2]


def test_a_rolled_back_transaction_records_no_token(fence: SqlFence) -> None:
    class Abort(Exception):
        pass

    with pytest.raises(Abort), fence.engine.begin() as conn:
        fence.apply("job", 9, "a", conn=conn)
        raise Abort
    assert fence.highest_token("job") is None and fence.effects() == []
    assert fence.apply_now("job", 3, "a") is FenceOutcome.ACCEPTED


def _postgres_lock_waiters(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()")).scalar_one())
    finally:
        engine.dispose()


def _wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)  # poll interval inside a deadline loop


@pytest.mark.parametrize("commit", [True, False])
def test_an_open_transaction_holds_the_resource_lock(fence: SqlFence, db: Db, commit: bool) -> None:
    """T1 applies token 5 and stays open; T2's token 4 must wait for T1 and is then
    rejected if T1 committed, accepted if it rolled back."""
    results: list[object] = []
    t2_started = threading.Event()

    def t2() -> None:
        t2_started.set()
        try:
            results.append(fence.apply_now("job", 4, "late"))
        except FenceRejected as exc:
            results.append(exc)

    conn = fence.engine.connect()
    trans = conn.begin()
    fence.apply("job", 5, "first", conn=conn)
    thread = threading.Thread(target=t2)
    thread.start()
    t2_started.wait(10)
    if db.kind == "postgresql":  # observe T2 blocked on T1's row lock
        _wait_until(lambda: _postgres_lock_waiters(db.url) >= 1, 10, "T2 to wait for the lock")
    assert not results
    trans.commit() if commit else trans.rollback()
    conn.close()
    thread.join(30)
    assert len(results) == 1
    if commit:
        assert isinstance(results[0], FenceRejected) and results[0].highest_seen == 5
    else:
        assert results[0] is FenceOutcome.ACCEPTED and fence.highest_token("job") == 4


# -- concurrency ----------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    resource: str
    token: int
    effect_id: str
    t_invoke: float
    t_return: float
    outcome: str  # accepted | duplicate | rejected
    highest_seen: int | None = None


def check_linearizable(calls: list[Call], fence: SqlFence) -> None:
    """What a correct fence guarantees, checked against the calls' outcomes and the
    effects table:

    * effects of one resource, in seq order, carry non-decreasing tokens;
    * every accepted call is in the table, every rejected one is not;
    * a rejection names a higher token that was accepted;
    * a call invoked after an accepted call with a higher token returned is rejected;
    * the recorded highest token is the highest accepted.
    """
    effects = fence.effects()
    by_resource: dict[str, list[int]] = {}
    for effect in effects:
        by_resource.setdefault(effect.resource, []).append(effect.token)
    for resource, tokens in by_resource.items():
        assert tokens == sorted(tokens), f"{resource}: tokens out of order {tokens}"
        assert fence.highest_token(resource) == max(tokens)
    keys = {(e.resource, e.token, e.effect_id) for e in effects}
    accepted = [c for c in calls if c.outcome == "accepted"]
    for call in calls:
        key = (call.resource, call.token, call.effect_id)
        if call.outcome == "accepted":
            assert key in keys
        elif call.outcome == "rejected":
            assert key not in keys
            assert call.highest_seen is not None and call.highest_seen > call.token
            assert call.highest_seen in by_resource[call.resource]
    for call in calls:
        if call.outcome != "accepted":
            continue
        for earlier in accepted:
            if (earlier.resource == call.resource and earlier.token > call.token
                    and earlier.t_return < call.t_invoke):
                raise AssertionError(f"{call} accepted after {earlier} had returned")


def _apply_timed(fence: SqlFence, resource: str, token: int, effect_id: str) -> Call:
    t0 = time.monotonic()
    try:
        outcome = fence.apply_now(resource, token, effect_id).value
        highest = None
    except FenceRejected as exc:
        outcome, highest = "rejected", exc.highest_seen
    return Call(resource, token, effect_id, t0, time.monotonic(), outcome, highest)


def test_first_insert_race_between_threads(fence: SqlFence) -> None:
    """Eight threads apply distinct tokens to a resource nobody has seen, released
    together by a barrier; repeated over fresh resources."""
    threads_n, rounds = 8, 15
    calls: list[Call] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads_n, timeout=30)

    def run(index: int) -> None:
        for r in range(rounds):
            barrier.wait()
            call = _apply_timed(fence, f"fresh-{r}", index + 1, "e")
            with lock:
                calls.append(call)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(calls) == threads_n * rounds
    check_linearizable(calls, fence)
    for r in range(rounds):
        assert any(c.outcome == "accepted" for c in calls if c.resource == f"fresh-{r}")


RACER = r"""
import json, random, sys, time
from consensus_lease.fencing_sql import SqlFence
from consensus_lease.errors import FenceRejected
url, prefix, strategy, seed, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
fence = SqlFence(url, table_prefix=prefix, strategy=strategy, create_tables=False)
rng = random.Random(seed)
for i in range(n):
    resource = f"r{rng.randrange(3)}"
    token = rng.randrange(1, 40) + i // 4   # drifts upwards, like generations
    t0 = time.monotonic()
    try:
        outcome, highest = fence.apply_now(resource, token, f"p{seed}-{i}").value, None
    except FenceRejected as exc:
        outcome, highest = "rejected", exc.highest_seen
    print(json.dumps([resource, token, f"p{seed}-{i}", t0, time.monotonic(), outcome, highest]))
fence.close()
"""


@pytest.mark.slow
def test_processes_racing_tokens(fence: SqlFence, db: Db) -> None:
    """Four OS processes race random, drifting tokens on three resources."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, db.url, db.prefix, fence.strategy, str(seed), "150"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for seed in range(4)
    ]
    calls: list[Call] = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        calls += [Call(*json.loads(line)) for line in out.splitlines()]
    assert len(calls) == 600
    outcomes = {c.outcome for c in calls}
    assert outcomes >= {"accepted", "rejected"}, outcomes
    check_linearizable(calls, fence)


def test_postgres_is_really_used_when_configured() -> None:
    """Guards against a silently wrong URL: the server must answer as PostgreSQL."""
    url = postgres_url_or_skip()
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            assert "PostgreSQL" in conn.execute(text("SELECT version()")).scalar_one()
    finally:
        engine.dispose()


@pytest.fixture
def pg_db() -> Iterator[Db]:
    """PostgreSQL only: for what only PostgreSQL's snapshots and isolation levels show."""
    url = postgres_url_or_skip()
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    yield Db("postgresql", url, prefix)
    cleanup = SqlFence(url, table_prefix=prefix, create_tables=False)
    cleanup.drop_tables()
    cleanup.close()


def test_serializable_transactions_are_retried_not_wrong(pg_db: Db) -> None:
    """Under SERIALIZABLE the database aborts racing transactions; ``apply_now`` retries
    them (FenceRetryable inside), and the outcome is still linearizable."""
    db = pg_db
    engine = create_engine(db.url, isolation_level="SERIALIZABLE")
    fence = SqlFence(engine, table_prefix=db.prefix, max_attempts=100)
    threads_n, rounds = 6, 10
    calls: list[Call] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads_n, timeout=30)

    def run(index: int) -> None:
        for r in range(rounds):
            barrier.wait()
            call = _apply_timed(fence, f"ser-{r % 2}", index + 1 + r, f"e{index}-{r}")
            with lock:
                calls.append(call)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(calls) == threads_n * rounds
    check_linearizable(calls, fence)
    engine.dispose()


@pytest.mark.parametrize("strategy", ["upsert", "lock"])
def test_a_serialization_failure_in_the_callers_transaction_is_retryable(
    pg_db: Db, strategy: str
) -> None:
    """The first-insert race seen from REPEATABLE READ: the second transaction cannot see
    the row the first one committed after its snapshot began, and is told to retry."""
    db = pg_db
    engine = create_engine(db.url, isolation_level="REPEATABLE READ")
    fence = SqlFence(engine, table_prefix=db.prefix, strategy=strategy)  # type: ignore[arg-type]
    with engine.connect() as late:
        trans = late.begin()
        late.execute(text("SELECT 1"))  # its snapshot starts here
        fence.apply_now("job", 3, "first")  # committed after that snapshot
        with pytest.raises(FenceRetryable):
            fence.apply("job", 4, "second", conn=late)
        trans.rollback()
    assert fence.apply_now("job", 4, "second") is FenceOutcome.ACCEPTED
    engine.dispose()


# -- once per job ------------------------------------------------------------------------

STEPS = ("step-1", "step-2", "step-3")


def test_once_per_job_takeover_applies_each_effect_once(fence: SqlFence, db: Db) -> None:
    """A (token 1) applies 2 of 3 steps, each with its own write, and is paused; B (token
    2) runs all 3: one new effect, two ALREADY_APPLIED; A's late write is rejected. The
    caller's ledger, written only on ACCEPTED in the same transaction, has each step once."""
    ledger = _ledger(fence, db.prefix)

    def run_step(token: int, step: str) -> FenceOutcome:
        with fence.engine.begin() as conn:
            outcome = fence.apply("job", token, step, once_per_job=True, conn=conn)
            if outcome is FenceOutcome.ACCEPTED:
                conn.execute(ledger.insert().values(what=f"{step} by {token}"))
            return outcome

    assert [run_step(1, step) for step in STEPS[:2]] == [FenceOutcome.ACCEPTED] * 2
    assert [run_step(2, step) for step in STEPS] == [
        FenceOutcome.ALREADY_APPLIED, FenceOutcome.ALREADY_APPLIED, FenceOutcome.ACCEPTED,
    ]
    with pytest.raises(FenceRejected) as rejected:
        run_step(1, "step-3")
    assert rejected.value.highest_seen == 2 and rejected.value.generation == 1
    with fence.engine.connect() as conn:
        assert sorted(conn.execute(select(ledger.c.what)).scalars()) == [
            "step-1 by 1", "step-2 by 1", "step-3 by 2",
        ]
    assert Counter(e.effect_id for e in fence.effects("job")) == dict.fromkeys(STEPS, 1)
    assert [(i, e.token) for i, e in fence.applied("job").items()] == [
        ("step-1", 1), ("step-2", 1), ("step-3", 2),
    ]
    assert fence.highest_token("job") == 2
    ledger.metadata.drop_all(fence.engine)


def test_default_mode_redoes_steps_after_takeover(fence: SqlFence) -> None:
    """The problem once_per_job solves: keyed with the token, B's steps are new effects."""
    fence.apply_now("job", 1, "charge")
    assert fence.apply_now("job", 2, "charge") is FenceOutcome.ACCEPTED
    assert [e.token for e in fence.effects("job")] == [1, 2]


def test_once_per_job_repeat_records_the_newer_token(fence: SqlFence) -> None:
    fence.apply_now("job", 1, "step-1", once_per_job=True)
    assert fence.apply_now("job", 2, "step-1", once_per_job=True) is FenceOutcome.ALREADY_APPLIED
    assert fence.highest_token("job") == 2
    with pytest.raises(FenceRejected):  # A is fenced out by B's repeat alone
        fence.apply_now("job", 1, "step-2", once_per_job=True)
    with pytest.raises(FenceRejected):  # stale and applied: still told it lost the job
        fence.apply_now("job", 1, "step-1", once_per_job=True)
    assert list(fence.applied("job")) == ["step-1"]


def test_once_per_job_retry_and_mixed_modes(fence: SqlFence) -> None:
    assert fence.apply_now("job", 3, "charge", once_per_job=True) is FenceOutcome.ACCEPTED
    assert fence.apply_now("job", 3, "charge", once_per_job=True) is FenceOutcome.ALREADY_APPLIED
    fence.apply_now("job", 3, "email")  # default mode
    assert fence.apply_now("job", 4, "email", once_per_job=True) is FenceOutcome.ALREADY_APPLIED
    assert fence.apply_now("other", 1, "charge", once_per_job=True) is FenceOutcome.ACCEPTED
    assert fence.applied("never") == {}
    assert [(e.resource, e.effect_id) for e in fence.effects()] == [
        ("job", "charge"), ("job", "email"), ("other", "charge"),
    ]


def test_applied_keeps_the_first_of_repeated_ids(fence: SqlFence) -> None:
    fence.apply_now("job", 1, "b")
    fence.apply_now("job", 1, "a")
    fence.apply_now("job", 2, "b")  # default mode: a second "b"
    assert [(i, e.token) for i, e in fence.applied("job").items()] == [("b", 1), ("a", 1)]


def test_unfenced_once_per_job_still_dedupes(db: Db) -> None:
    fence = db.fence(enforce_tokens=False)
    fence.apply_now("job", 5, "a", once_per_job=True)
    assert fence.apply_now("job", 4, "a", once_per_job=True) is FenceOutcome.ALREADY_APPLIED
    assert fence.apply_now("job", 4, "b", once_per_job=True) is FenceOutcome.ACCEPTED
    assert fence.highest_token("job") == 5
    fence.close()


def test_a_rolled_back_once_per_job_effect_can_be_applied_again(fence: SqlFence) -> None:
    class Abort(Exception):
        pass

    with pytest.raises(Abort), fence.engine.begin() as conn:
        assert fence.apply("job", 1, "charge", once_per_job=True, conn=conn) is FenceOutcome.ACCEPTED
        raise Abort
    assert fence.applied("job") == {} and fence.highest_token("job") is None
    assert fence.apply_now("job", 2, "charge", once_per_job=True) is FenceOutcome.ACCEPTED


@pytest.mark.parametrize("flag", [1, 0, "yes", None])
def test_non_bool_once_per_job_is_rejected_before_any_sql(fence: SqlFence, flag: object) -> None:
    with pytest.raises(InvalidArgument, match="once_per_job"):
        fence.apply_now("job", 1, "e", once_per_job=flag)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="once_per_job"), fence.engine.begin() as conn:
        fence.apply("job", 1, "e", once_per_job=flag, conn=conn)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        fence.applied("")
    assert fence.effects() == [] and fence.highest_token("job") is None


def test_as_fence_passes_once_per_job_and_applied(fence: SqlFence) -> None:
    plain: Fence = fence.as_fence()  # mypy checks the structural match
    assert plain.apply("job", 1, "a", once_per_job=True) is FenceOutcome.ACCEPTED
    assert plain.apply("job", 2, "a", once_per_job=True) is FenceOutcome.ALREADY_APPLIED
    assert list(plain.applied("job")) == ["a"]


@pytest.mark.parametrize("commit", [True, False])
def test_a_racing_once_per_job_apply_waits_for_the_open_transaction(
    fence: SqlFence, db: Db, commit: bool
) -> None:
    """T1 applies step-1 with token 5 and stays open; T2 (the next holder, token 6)
    applies step-1 once-per-job: it waits for T1, then finds the effect if T1 committed
    (ALREADY_APPLIED) or applies it if T1 rolled back (ACCEPTED)."""
    results: list[FenceOutcome] = []
    conn = fence.engine.connect()
    trans = conn.begin()
    fence.apply("job", 5, "step-1", once_per_job=True, conn=conn)
    thread = threading.Thread(
        target=lambda: results.append(fence.apply_now("job", 6, "step-1", once_per_job=True))
    )
    thread.start()
    if db.kind == "postgresql":  # observe T2 blocked on T1's row lock
        _wait_until(lambda: _postgres_lock_waiters(db.url) >= 1, 10, "T2 to wait for the lock")
    assert not results
    trans.commit() if commit else trans.rollback()
    conn.close()
    thread.join(30)
    expected = FenceOutcome.ALREADY_APPLIED if commit else FenceOutcome.ACCEPTED
    assert results == [expected]
    assert [e.token for e in fence.effects("job")] == ([5] if commit else [6])
    assert fence.highest_token("job") == 6


ONCE_RACER = r"""
import sys
from consensus_lease.fencing_sql import SqlFence
url, prefix, strategy = sys.argv[1:4]
fence = SqlFence(url, table_prefix=prefix, strategy=strategy, create_tables=False)
print("ready", flush=True)
for line in sys.stdin:
    print(fence.apply_now("job", 1, line.strip(), once_per_job=True).value, flush=True)
fence.close()
"""


def _child_env() -> dict[str, str]:
    """The children import the consensus_lease under test, not an installed one."""
    root = str(Path(consensus_lease.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}


def test_processes_racing_one_once_per_job_effect(fence: SqlFence, db: Db) -> None:
    """Two OS processes, released together each round, apply the same once-per-job
    effect with the same token: exactly one ACCEPTED, one ALREADY_APPLIED per round."""
    rounds = 30
    procs = [
        subprocess.Popen([sys.executable, "-c", ONCE_RACER, db.url, db.prefix, fence.strategy],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=_child_env())
        for _ in range(2)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for r in range(rounds):
            for proc in procs:  # release both children back to back
                assert proc.stdin is not None
                proc.stdin.write(f"effect-{r}\n")
                proc.stdin.flush()
            outcomes = sorted(proc.stdout.readline().strip() for proc in procs if proc.stdout)
            assert outcomes == ["accepted", "already_applied"], (r, outcomes)
    finally:
        for proc in procs:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
    counts = Counter(e.effect_id for e in fence.effects("job"))
    assert counts == {f"effect-{r}": 1 for r in range(rounds)}


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 5), st.sampled_from("abcd")), max_size=12))
def test_once_per_job_matches_a_model(fence: SqlFence, ops: list[tuple[int, str]]) -> None:
    """Random interleavings of holders' once-per-job effects agree with the rule: stale
    token -> rejected; else applied iff never applied before; highest = max token seen.
    (One fence for all examples: each example gets a resource of its own.)"""
    resource = f"prop-{uuid.uuid4().hex}"
    highest: int | None = None
    done: list[tuple[str, int]] = []
    for token, effect in ops:
        if highest is not None and token < highest:
            with pytest.raises(FenceRejected):
                fence.apply_now(resource, token, effect, once_per_job=True)
            continue
        outcome = fence.apply_now(resource, token, effect, once_per_job=True)
        highest = token
        if effect in {e for e, _ in done}:
            assert outcome is FenceOutcome.ALREADY_APPLIED
        else:
            assert outcome is FenceOutcome.ACCEPTED
            done.append((effect, token))
    assert [(i, e.token) for i, e in fence.applied(resource).items()] == done
    assert len(fence.effects(resource)) == len(done)
    assert fence.highest_token(resource) == highest


@pytest.mark.parametrize("strategy", ["upsert", "lock"])
def test_once_per_job_under_repeatable_read_is_retryable_not_doubled(
    pg_db: Db, strategy: str
) -> None:
    """REPEATABLE READ: a transaction whose snapshot predates another's once-per-job
    apply of the same effect cannot see that effect row; it must be told to retry, never
    apply the effect a second time — also when the other apply left the token unchanged."""
    db = pg_db
    engine = create_engine(db.url, isolation_level="REPEATABLE READ")
    fence = SqlFence(engine, table_prefix=db.prefix, strategy=strategy)  # type: ignore[arg-type]
    fence.apply_now("job", 8, "step-0", once_per_job=True)  # highest is 8 from here on
    with engine.connect() as late:
        trans = late.begin()
        late.execute(text("SELECT 1"))  # its snapshot starts here
        fence.apply_now("job", 8, "step-1", once_per_job=True)  # same token: 8 stays 8
        with pytest.raises(FenceRetryable):
            fence.apply("job", 9, "step-1", once_per_job=True, conn=late)
        trans.rollback()
    assert fence.apply_now("job", 9, "step-1", once_per_job=True) is FenceOutcome.ALREADY_APPLIED
    assert [e.effect_id for e in fence.effects("job")] == ["step-0", "step-1"]
    engine.dispose()


def test_a_token_past_64_bits_is_invalid_and_changes_nothing(fence: SqlFence) -> None:
    with pytest.raises(InvalidArgument, match="64-bit"):
        fence.apply_now("job", 2**63, "charge")
    assert fence.highest_token("job") is None
