"""The tooz driver beyond what tooz's own suite checks (test_tooz_suite.py runs that):
fencing tokens, a lost session reported (never swallowed), heartbeats keeping holds,
shared and exclusive holds never overlapping across coordinators, typed errors for bad
options, the leader's token; and its packaging (entry points, the extras).

On SQLite in a temporary file: no server, a few seconds in all.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import consensus_lease

tooz = pytest.importorskip("tooz", reason="the tooz extra (pip install 'consensus_lease[tooz]')")

from tooz import coordination  # noqa: E402

from consensus_lease.integrations.tooz import (  # noqa: E402
    Coordinator,
    FencedLock,
    InvalidToozArgument,
    LockNotHeld,
    SessionLost,
)
from consensus_lease.testing.conformance import poll_until  # noqa: E402
from consensus_lease.testing.tooz_suite import (  # noqa: E402
    TOOZ_SCHEMES,
    _entry_points_path,
    _python_path,
)

ROOT = Path(consensus_lease.__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def _registered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """This checkout's tooz.backends entry points, also in an environment installed from
    elsewhere (as the suite runner does for its subprocess)."""
    shim = _entry_points_path(tmp_path_factory.mktemp("entry-points"))
    if shim is not None:
        sys.path.append(shim)
        import importlib

        importlib.invalidate_caches()
    yield
    if shim is not None:
        sys.path.remove(shim)


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Callable[..., Coordinator]]:
    """``coordinator(member=None, **options)``: a started coordinator on one SQLite file,
    stopped after the test."""
    started: list[Coordinator] = []

    def make(member: bytes | None = None, **options: object) -> Coordinator:
        coord = coordination.get_coordinator(
            f"consensus-lease+sqlite:///{tmp_path}/tooz.db",
            member or uuid.uuid4().hex.encode(), **options)
        assert isinstance(coord, Coordinator)
        coord.start()
        started.append(coord)
        return coord

    yield make
    for coord in started:
        if coord.is_started:
            coord.stop()


# --8<-- [start:example]
from consensus_lease import FenceRejected, SqliteFence  # noqa: E402


def test_a_tooz_lock_fences_a_late_write(tmp_path: Path) -> None:
    url = f"consensus-lease+sqlite:///{tmp_path}/leases.db"
    fence = SqliteFence(str(tmp_path / "effects.db"))      # the destination

    a = coordination.get_coordinator(url + "?timeout=0.5", b"worker-a")
    a.start()                          # no heart: "a" stops renewing, like a paused worker
    lock_a = a.get_lock(b"invoice-42")
    assert lock_a.acquire(blocking=False)
    fence.apply("invoice-42", lock_a.fencing_token, "reserve")

    b = coordination.get_coordinator(url, b"worker-b")
    b.start(start_heart=True)          # heartbeats renew b's session
    lock_b = b.get_lock(b"invoice-42")
    assert lock_b.acquire(blocking=30.0)  # once the store expired a's session
    assert lock_b.fencing_token > lock_a.fencing_token
    fence.apply("invoice-42", lock_b.fencing_token, "reserve")

    assert not lock_a.is_still_owner()    # a's local check says so ...
    with pytest.raises(FenceRejected):    # ... and its late write is refused
        fence.apply("invoice-42", lock_a.fencing_token, "charge")
    assert not lock_a.release()           # the store compares owner and generation
    assert lock_b.release()
    a.stop()
    b.stop()
# --8<-- [end:example]


def lock_of(coord: Coordinator, name: bytes) -> FencedLock:
    lock = coord.get_lock(name)
    assert isinstance(lock, FencedLock)
    return lock


def test_each_acquire_gets_a_higher_fencing_token(coordinator: Callable[..., Coordinator]) -> None:
    a, b = coordinator(), coordinator()
    first, second = lock_of(a, b"invoice-42"), lock_of(b, b"invoice-42")
    with pytest.raises(LockNotHeld):
        first.fencing_token  # noqa: B018  (a property that raises)
    assert first.acquire(blocking=False)
    token = first.fencing_token
    assert first.lease.generation == token
    assert not second.acquire(blocking=False)
    assert first.release()
    assert second.acquire(blocking=5.0)
    second_token = second.fencing_token
    assert second_token > token
    assert second.release()
    assert first.acquire(blocking=False)
    assert first.fencing_token > second_token
    assert first.release()


def test_a_lost_session_is_reported_and_its_lock_taken_over(
    coordinator: Callable[..., Coordinator],
) -> None:
    # timeout=0.5 and no heartbeat: the store ends the session; nothing hides that.
    quiet = coordinator(timeout=0.5)
    lock = lock_of(quiet, b"report")
    assert lock.acquire(blocking=False)
    stale = lock.fencing_token
    rival = lock_of(coordinator(), b"report")
    poll_until(lambda: rival.acquire(blocking=False), timeout_s=30.0)  # after the expiry
    assert rival.fencing_token > stale
    assert not lock.is_still_owner()
    with pytest.raises(tooz.ToozError):
        lock.ensure_held()
    with pytest.raises(SessionLost):
        quiet.heartbeat()
    assert not lock.release()  # the store refused it: the rival still holds the lock
    assert rival.is_still_owner()
    assert rival.release()


def test_heartbeats_keep_a_lock_past_its_timeout(coordinator: Callable[..., Coordinator]) -> None:
    holder = coordinator(timeout=2.0)
    holder.heart.start()  # tooz's Heart: heartbeat() every timeout / 6 or so
    lock = lock_of(holder, b"kept")
    rival = lock_of(coordinator(), b"kept")
    assert lock.acquire(blocking=False)
    end = time.monotonic() + 3.0  # more than one timeout must really pass
    while time.monotonic() < end:
        assert lock.is_still_owner()
        assert not rival.acquire(blocking=False)
        time.sleep(0.2)  # poll interval of a deadline loop
    assert lock.release()


def test_shared_and_exclusive_holds_never_overlap(
    coordinator: Callable[..., Coordinator],
) -> None:
    coords = [coordinator() for _ in range(3)]
    inside = {"readers": 0, "writers": 0}
    guard = threading.Lock()
    problems: list[str] = []
    shared_seen = threading.Event()

    def work(coord: Coordinator, seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(12):
            shared = rng.random() < 0.6
            lock = lock_of(coord, b"rw")
            if not lock.acquire(blocking=30.0, shared=shared):
                problems.append("acquire timed out")
                return
            with guard:
                inside["readers" if shared else "writers"] += 1
                if inside["writers"] > 1 or (inside["writers"] and inside["readers"]):
                    problems.append(f"overlap: {inside}")
                if inside["readers"] > 1:
                    shared_seen.set()
            time.sleep(rng.uniform(0.0, 0.02))  # the hold's length: real time passes
            with guard:
                inside["readers" if shared else "writers"] -= 1
            assert lock.release()

    threads = [threading.Thread(target=work, args=(c, i)) for i, c in enumerate(coords)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120.0)
    assert not any(thread.is_alive() for thread in threads)
    assert problems == []


def test_shared_holders_share(coordinator: Callable[..., Coordinator]) -> None:
    a, b = coordinator(), coordinator()
    first, second = lock_of(a, b"books"), lock_of(b, b"books")
    writer = lock_of(coordinator(), b"books")
    assert first.acquire(shared=True, blocking=False)
    assert second.acquire(shared=True, blocking=False)
    assert not writer.acquire(blocking=False)
    assert first.release() and second.release()
    assert writer.acquire(blocking=5.0)
    assert not first.acquire(shared=True, blocking=False)
    assert writer.release()


@pytest.mark.parametrize("options", [{"timeout": "soon"}, {"timeout": "0"}, {"timeout": "-1"},
                                     {"keepalive": "sometimes"}])
def test_bad_driver_options_are_typed_errors(tmp_path: Path, options: dict[str, str]) -> None:
    with pytest.raises(InvalidToozArgument):
        coordination.get_coordinator(f"consensus-lease+sqlite:///{tmp_path}/x.db", b"m",
                                     **options)
    assert not (tmp_path / "x.db").exists()


def test_a_bad_store_option_is_a_typed_error_at_start(tmp_path: Path) -> None:
    coord = coordination.get_coordinator(
        f"consensus-lease+sqlite:///{tmp_path}/x.db?no_such_option=1", b"m")
    with pytest.raises(InvalidToozArgument, match="no_such_option"):
        coord.start()
    assert not coord.is_started


def test_bad_lock_waits_are_typed_errors(coordinator: Callable[..., Coordinator]) -> None:
    lock = lock_of(coordinator(), b"w")
    with pytest.raises(InvalidToozArgument):
        lock.acquire(blocking=-1.0)
    with pytest.raises(InvalidToozArgument):
        lock.acquire(timeout="never")  # type: ignore[arg-type]
    assert not lock.is_still_owner()


def test_the_leader_has_a_fencing_token(coordinator: Callable[..., Coordinator]) -> None:
    a, b = coordinator(b"alpha"), coordinator(b"beta")
    group = b"schedulers"
    a.create_group(group).get()
    elected: list[bytes] = []
    for coord in (a, b):
        coord.watch_elected_as_leader(group, lambda event: elected.append(event.member_id))
        coord.run_watchers()
    assert elected == [b"alpha"]
    first = a.leadership(group)
    assert first is not None and b.leadership(group) is None
    assert a.get_leader(group).get() == b"alpha"
    assert a.stand_down_group_leader(group)
    b.run_watchers()
    second = b.leadership(group)
    assert elected == [b"alpha", b"beta"]
    assert second is not None and second.generation > first.generation
    assert a.get_leader(group).get() == b"beta"


def test_str_member_and_group_ids_come_back_as_bytes(
    coordinator: Callable[..., Coordinator],
) -> None:
    coord = coordinator("str-member")  # type: ignore[arg-type]
    coord.create_group("str-group").get()  # type: ignore[arg-type]
    coord.join_group(b"str-group", {"port": 8080}).get()
    assert b"str-group" in coord.get_groups().get()
    assert coord.get_members(b"str-group").get() == {b"str-member"}
    info = coord.get_member_info(b"str-group", b"str-member").get()
    assert info["capabilities"] == {"port": 8080} and info["generation"] >= 1


# -- packaging ----------------------------------------------------------------------------


def test_the_entry_points_and_extras_are_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["tooz.backends"] == TOOZ_SCHEMES
    assert not any("tooz" in r for r in project["dependencies"])
    extras = project["optional-dependencies"]
    assert any(r.startswith("tooz") for r in extras["tooz"])
    assert any("tooz-test" in r for r in extras["dev"])
    for library in ("sysv_ipc", "pymemcache", "redis", "PyMySQL", "psycopg2-binary",
                    "etcd3gw", "kazoo", "fixtures", "testtools", "oslo.utils"):
        assert any(r.startswith(library) for r in extras["tooz-test"]), library


def test_without_tooz_the_import_names_the_extra() -> None:
    code = ("import sys\nsys.modules['tooz'] = None\n"
            "try:\n    import consensus_lease.integrations.tooz\n"
            "except ImportError as exc:\n    print(exc)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert "pip install 'consensus_lease[tooz]'" in done.stdout, done.stdout


def test_the_suite_runner_lists_each_folder_once() -> None:
    # The checkout on PYTHONPATH and as the package's root: listed twice, its egg-info
    # registered every scheme twice and tooz loaded no driver at all.
    assert _python_path(["/repo", "/shim"], os.pathsep.join(["/repo", "", "/other"])) == (
        os.pathsep.join(["/repo", "/shim", "/other"]))
