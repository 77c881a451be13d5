"""Read-modify-write at the destination: the fenced read (``read_fenced`` records the
token with the read, ``write_fenced`` writes back only if no higher token was recorded
since and the value is the version read), on SqliteFence and SqlFence (SQLite and
PostgreSQL). The race it closes is the model's write-only-fenced counterexample
(docs/model.md): an old holder's write landing after the new holder's read."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest
from sqlalchemy import Connection

from consensus_lease import FenceRejected, InvalidArgument, open_store
from consensus_lease.clock import FakeClock
from consensus_lease.fencing import FencedRead, FenceOutcome, SqliteFence
from consensus_lease.fencing_sql import SqlFence

POSTGRES_ENV = "CONSENSUS_LEASE_POSTGRES_URL"


class Rmw(Protocol):
    def read(self, resource: str, token: int) -> FencedRead: ...
    def write(self, read: FencedRead, value: bytes) -> FencedRead: ...
    def apply(self, resource: str, token: int, effect_id: str) -> FenceOutcome: ...


class SqliteRmw:
    def __init__(self, fence: SqliteFence) -> None:
        self.fence = fence

    def read(self, resource: str, token: int) -> FencedRead:
        return self.fence.read_fenced(resource, token)

    def write(self, read: FencedRead, value: bytes) -> FencedRead:
        return self.fence.write_fenced(read, value)

    def apply(self, resource: str, token: int, effect_id: str) -> FenceOutcome:
        return self.fence.apply(resource, token, effect_id)


class SqlRmw:
    def __init__(self, fence: SqlFence) -> None:
        self.fence = fence

    def _run(self, work: object) -> object:
        with self.fence.engine.begin() as conn:
            return work(conn)  # type: ignore[operator]

    def read(self, resource: str, token: int) -> FencedRead:
        def work(conn: Connection) -> FencedRead:
            return self.fence.read_fenced(conn, resource, token)
        result = self._run(work)
        assert isinstance(result, FencedRead)
        return result

    def write(self, read: FencedRead, value: bytes) -> FencedRead:
        def work(conn: Connection) -> FencedRead:
            return self.fence.write_fenced(conn, read, value)
        result = self._run(work)
        assert isinstance(result, FencedRead)
        return result

    def apply(self, resource: str, token: int, effect_id: str) -> FenceOutcome:
        return self.fence.apply_now(resource, token, effect_id)


@pytest.fixture(params=["sqlite-fence", "sql-sqlite-upsert", "sql-sqlite-lock", "sql-postgresql"])
def rmw(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rmw]:
    if request.param == "sqlite-fence":
        fence = SqliteFence(str(tmp_path / "dest.db"))
        yield SqliteRmw(fence)
        fence.close()
        return
    if request.param == "sql-postgresql":
        url = os.environ.get(POSTGRES_ENV, "").strip()
        if not url:
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"{POSTGRES_ENV} is not set (CI=true: PostgreSQL tests must run)")
            pytest.skip(f"{POSTGRES_ENV} is not set: eval \"$(bash scripts/start-postgres.sh)\"")
        url = url.replace("postgresql://", "postgresql+psycopg://", 1)
        sql = SqlFence(url, table_prefix=f"t{uuid.uuid4().hex[:10]}_")
    else:
        strategy = request.param.rsplit("-", 1)[1]
        sql = SqlFence(f"sqlite:///{tmp_path / 'sql.db'}", strategy=strategy)  # type: ignore[arg-type]
    yield SqlRmw(sql)
    if request.param == "sql-postgresql":
        sql.drop_tables()
    sql.close()


def _add(read: FencedRead, item: str) -> bytes:
    items = set(json.loads(read.value or b"[]")) | {item}
    return json.dumps(sorted(items)).encode()


def test_an_old_holders_write_after_the_new_holders_read_is_rejected(rmw: Rmw) -> None:
    a = rmw.read("set-1", 7)               # A (token 7) reads, then is paused
    b = rmw.read("set-1", 8)               # B (token 8) took the job over: reads
    assert a.value is None and b.value is None and a.version == b.version == 0
    with pytest.raises(FenceRejected) as rejected:
        rmw.write(a, _add(a, "a"))          # A's late write-back: refused, not lost later
    assert rejected.value.highest_seen == 8 and rejected.value.generation == 7
    after = rmw.write(b, _add(b, "b"))
    assert json.loads(after.value or b"") == ["b"] and after.version == 1
    again = rmw.read("set-1", 8)
    assert again.value == after.value and again.version == 1


def test_a_write_before_the_new_read_is_kept(rmw: Rmw) -> None:
    a = rmw.read("set-1", 7)
    rmw.write(a, _add(a, "a"))
    b = rmw.read("set-1", 8)
    rmw.write(b, _add(b, "b"))
    assert json.loads(rmw.read("set-1", 8).value or b"") == ["a", "b"]


def test_a_stale_read_is_refused_and_records_nothing(rmw: Rmw) -> None:
    rmw.read("set-1", 8)
    with pytest.raises(FenceRejected):
        rmw.read("set-1", 7)
    assert rmw.read("set-1", 8).version == 0


def test_a_second_write_from_one_read_is_refused(rmw: Rmw) -> None:
    read = rmw.read("set-1", 7)
    rmw.write(read, b"[1]")
    with pytest.raises(FenceRejected, match="written since the read"):
        rmw.write(read, b"[2]")            # same token, stale version: would drop [1]
    assert rmw.read("set-1", 7).value == b"[1]"


def test_the_read_fences_effects_too(rmw: Rmw) -> None:
    rmw.read("job", 8)
    with pytest.raises(FenceRejected):
        rmw.apply("job", 7, "step-1")
    assert rmw.apply("job", 8, "step-1") is FenceOutcome.ACCEPTED


def test_bad_input_is_invalid_argument(rmw: Rmw) -> None:
    for token in (0, -1, True, "7", 2**63):
        with pytest.raises(InvalidArgument):
            rmw.read("set-1", token)  # type: ignore[arg-type]
    read = rmw.read("set-1", 7)
    with pytest.raises(InvalidArgument):
        rmw.write(read, "text")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        rmw.write(("set-1", 7, None, 0), b"x")  # type: ignore[arg-type]
    assert rmw.read("set-1", 7).version == 0


def test_with_real_leases_the_taken_over_holder_cannot_drop_an_update(tmp_path: Path) -> None:
    """The lost-update interleaving with leases on a store whose clock the test moves."""
    clock = FakeClock()
    fence = SqliteFence(str(tmp_path / "dest.db"))
    with open_store("memory://", store_clock=clock) as store:
        a, b = store.session("a", ttl_s=5), store.session("b", ttl_s=5)
        lease_a = a.claim("job")
        assert lease_a is not None
        read_a = fence.read_fenced("job", lease_a.generation)
        store.backend.expire_session(a.session_id)  # type: ignore[attr-defined]
        lease_b = b.claim("job")
        assert lease_b is not None and lease_b.generation > lease_a.generation
        read_b = fence.read_fenced("job", lease_b.generation)
        with pytest.raises(FenceRejected):
            fence.write_fenced(read_a, _add(read_a, "a"))
        fence.write_fenced(read_b, _add(read_b, "b"))
        lease_b.complete()
    assert fence.read_fenced("job", lease_b.generation).value == b'["b"]'
    fence.close()


@pytest.mark.parametrize("fields", [
    ("m3", 0, None, 0),  # token 0: below every lease's
    (None, 1, None, 0), ("", 1, None, 0),  # no resource
    ("m3", 2**64, None, 0),  # does not fit the fence's 64-bit column
    ("m3", 1, "text", 0), ("m3", 1, None, -1),
])
def test_a_fenced_read_built_by_hand_is_held_to_what_read_fenced_checks(
    fields: tuple[object, ...]
) -> None:
    """``FencedRead`` is public: one built by hand must not write with a token or a
    resource ``read_fenced`` would have refused (it did: token 0, a NULL resource)."""
    with pytest.raises(InvalidArgument):
        FencedRead(*fields)  # type: ignore[arg-type]
