"""ZooKeeper backend pieces that need no server: URL and options, job id encoding, the
data written into znodes, the negotiated-timeout capture, the store epoch in tokens and
what decides that the store's history went back."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError
from kazoo.handlers.utils import selector_select
from kazoo.protocol.serialization import Transaction as KazooTransaction
from kazoo.security import make_acl

from consensus_lease import open_store
from consensus_lease._election import election_key
from consensus_lease.backends.zookeeper import ZooKeeperBackend
from consensus_lease.backends.zookeeper._config import parse_url
from consensus_lease.backends.zookeeper._jobs_known import UNSEEN, Known, Released
from consensus_lease.backends.zookeeper._layout import (
    BUCKET_JOBS,
    CorruptData,
    Failure,
    JobPaths,
    LegacyQueueLayout,
    QueueHead,
    QueuePaths,
    QueueTag,
    bucket_of,
    decode_name,
    dump_claim,
    dump_completed,
    dump_delayed,
    dump_epoch,
    dump_failure,
    dump_new,
    dump_owner,
    encode_job_id,
    job_paths,
    member_name,
    parse_delayed,
    parse_epoch,
    parse_failure,
    parse_job,
    parse_member,
    parse_owner,
    split_token,
    to_record,
    token,
)
from consensus_lease.backends.zookeeper._sessions import NegotiatedTimeouts, session_text
from consensus_lease.backends.zookeeper._tokens_history import History
from consensus_lease.backends.zookeeper._transport_kazoo import PollHandler, poll_select
from consensus_lease.backends.zookeeper._transport_multi import Lean, Transaction, marker_trouble
from consensus_lease.errors import (
    BackendUnavailable,
    InvalidArgument,
    StoreRegressed,
    UnsupportedBackend,
    UnsupportedOperation,
)
from consensus_lease.options import merge_options
from consensus_lease.record import JobState
from consensus_lease.validation import MAX_JOB_ID_BYTES

# -- URL and options -------------------------------------------------------------------


def test_url_hosts_chroot_and_defaults() -> None:
    config = parse_url("zk://127.0.0.21:2181,127.0.0.22,[::1]:2182/a/b/", {})
    assert config.hosts == (("127.0.0.21", 2181), ("127.0.0.22", 2181), ("::1", 2182))
    assert config.hosts_text == "127.0.0.21:2181,127.0.0.22:2181,[::1]:2182"
    assert config.chroot == "/a/b" and config.base == "/a/b/jobs"
    assert (config.acl, config.tls, config.connect_timeout_s, config.timeout_s) == (
        "open", False, 10.0, 10.0,
    )
    assert parse_url("zookeeper://h", {}).chroot == ""


@pytest.mark.parametrize(
    "url",
    [
        "zk://", "zk:///chroot", "zk://h:0/x", "zk://h:99999/x", "zk://h:port/x",
        "zk://bad!host/x", "zk://h/a/../b", "zk://h/a//b", "zk://h/./a", "zk://h/zookeeper/x",
        "zk://u:p@h/x", "zk://h/x#frag", "zk://[::1/x", "etcd://h/x", "zk://h/a%00b",
    ],
)
def test_bad_urls(url: str) -> None:
    with pytest.raises(UnsupportedBackend):
        parse_url(url, {})


def test_options_from_query_and_kwargs() -> None:
    url = "zk://127.0.0.1:1/x?connect_timeout_s=2.5&user=svc&password=pw"
    config = parse_url(url, merge_options(url, {"timeout_s": 3}))
    assert (config.connect_timeout_s, config.timeout_s) == (2.5, 3.0)
    assert (config.user, config.password, config.acl) == ("svc", "pw", "creator")
    assert [a.perms for a in config.acl_list()] == [31]
    config = parse_url("zk://h/x", {"ca_file": __file__, "verify_certs": "false"})
    assert config.tls is True and config.verify_certs is False
    with pytest.raises(InvalidArgument):
        parse_url("zk://h/x", {"cert_file": "/nonexistent/client.crt"})
    world_read = parse_url("zk://h/x", {"user": "u", "password": "p", "acl": "creator_world_read"})
    assert len(world_read.acl_list()) == 2


@pytest.mark.parametrize(
    "options",
    [
        {"nope": "1"}, {"user": "svc"}, {"user": "a:b", "password": "p"}, {"acl": "creator"},
        {"acl": "everyone"}, {"tls": "maybe"}, {"connect_timeout_s": "-1"},
        {"timeout_s": "nan"}, {"timeout_s": True}, {"max_result_bytes": "-5"},
        {"user": ""},
    ],
)
def test_bad_options(options: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        parse_url("zk://h/x", options)


def test_open_store_connects_eagerly_and_both_schemes_resolve() -> None:
    """Like etcd, open_store connects (within connect_timeout_s): nothing listens on
    port 1, so the error comes from open_store itself, not from a later call."""
    caps = ZooKeeperBackend.capabilities
    assert caps.cross_process and caps.store_watch and caps.consecutive_generations
    for scheme in ("zk", "zookeeper"):
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match=r"no ZooKeeper member of 127\.0\.0\.1:1"):
            open_store(f"{scheme}://127.0.0.1:1/eager", connect_timeout_s=0.5)
        assert time.monotonic() - started < 10


def test_refused_connection_is_quiet_by_default() -> None:
    """With no logging configured, a refused open_store prints its one error and none
    of kazoo's per-attempt "Connection dropped" warnings."""
    code = textwrap.dedent(
        """
        from consensus_lease import BackendUnavailable, open_store
        try:
            open_store("zk://127.0.0.1:1/quiet", connect_timeout_s=0.5)
        except BackendUnavailable as exc:
            print("raised:", exc)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "raised: no ZooKeeper member" in done.stdout
    assert done.stderr == ""


def test_configured_logging_still_gets_kazoo_records(caplog: pytest.LogCaptureFixture) -> None:
    """The NullHandler only stops Python's last-resort printing: an application that
    configured logging (here pytest's handler on the root logger) sees kazoo's records."""
    with caplog.at_level(logging.WARNING), pytest.raises(BackendUnavailable):
        open_store("zk://127.0.0.1:1/logged", connect_timeout_s=0.5)
    assert any(r.name.startswith("kazoo") for r in caplog.records)


# -- job ids -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "job_id", ["a", ".", "..", "../x", "a/b", "/", "%2E", " ", "é", "\u2028", "x" * 256, "~_-"]
)
def test_job_id_names_are_single_safe_znode_names(job_id: str) -> None:
    name = encode_job_id(job_id)
    assert "/" not in name and name not in (".", "..") and "." not in name
    assert name.isascii() and name.isprintable()
    assert decode_name(name) == job_id


@given(st.lists(st.text(alphabet=st.characters(exclude_categories=["Cs"]), min_size=1,
                        max_size=64), min_size=2, max_size=6, unique=True))
def test_job_id_encoding_is_injective(job_ids: list[str]) -> None:
    names = [encode_job_id(j) for j in job_ids]
    assert len(set(names)) == len(names)
    assert [decode_name(n) for n in names] == job_ids


def test_longest_job_id_fits() -> None:
    name = encode_job_id("\U0001f600" * (MAX_JOB_ID_BYTES // 4))
    assert len(name) == 3 * MAX_JOB_ID_BYTES


@pytest.mark.parametrize("name", ["a.b", "%zz", "%C3", "%41", "", "owner%2f"])
def test_foreign_names_are_not_jobs(name: str) -> None:
    assert decode_name(name) is None


# -- data -----------------------------------------------------------------------------------


def test_job_data_round_trips() -> None:
    assert parse_job(b"", "/p").state == "new"
    held = parse_job(dump_claim("A\nB", "0x1"), "/p")
    assert (held.state, held.owner, held.session) == ("held", "A\nB", "0x1")
    done = parse_job(dump_completed("A", "0x1", 7, "n", b"\x00\n{raw"), "/p")
    assert (done.completed, done.generation, done.nonce, done.result) == (
        True, 7, "n", b"\x00\n{raw",
    )
    owner = parse_owner(dump_owner("é", "0x2", "abc"), "/p/owner")
    assert (owner.owner, owner.session, owner.nonce) == ("é", "0x2", "abc")


@given(st.text(max_size=12), st.text(max_size=12),
       st.one_of(st.text(max_size=12), st.binary(min_size=8, max_size=8).map(bytes.hex)),
       st.integers(-(2**40), 2**40), st.one_of(st.none(), st.integers(1, 99)),
       st.integers(0, 2**31))
def test_job_and_owner_data_are_the_bytes_json_dumps_writes(
    owner: str, session: str, nonce: str, number: int, limit: int | None, epoch: int,
) -> None:
    # The headers are written without json.dumps (cheaper); the bytes stay the same.
    import json

    def dumped(header: dict[str, Any], payload: bytes = b"") -> bytes:
        return json.dumps({"format": 1, **header}, separators=(",", ":")).encode() + b"\n" \
            + payload

    extra = {} if limit is None else {"max_attempts": limit}
    extra = extra if epoch == 0 else {**extra, "epoch": epoch}
    assert dump_claim(owner, session, number, limit, epoch) == dumped(
        {"state": "held", "owner": owner, "session": session, "attempt": number, **extra})
    assert dump_completed(owner, session, number, nonce, b"r\n", 3, limit, epoch) == dumped(
        {"state": "completed", "owner": owner, "session": session, "generation": number,
         "nonce": nonce, "attempt": 3, **extra}, b"r\n")
    assert dump_owner(owner, session, nonce) == json.dumps(
        {"owner": owner, "session": session, "nonce": nonce}).encode()


@pytest.mark.parametrize("data", [b"garbage", b'{"format":9}\n', b'{"format":1,"state":"x"}\n'])
def test_foreign_data_is_an_error_not_a_crash(data: bytes) -> None:
    with pytest.raises(CorruptData) as info:
        parse_job(data, "/p")
    assert isinstance(info.value, BackendUnavailable)


def test_records_from_znodes() -> None:
    paths = JobPaths.of("/c/jobs", "j")
    stat = SimpleNamespace(version=3)
    assert to_record(paths, None, None) is None
    held = to_record(paths, (dump_claim("A", "0x1"), stat), (dump_owner("A", "0x1", "n"), stat))
    assert held is not None and (held.state, held.owner, held.generation) == (
        JobState.HELD, "A", 3,
    )
    free = to_record(paths, (dump_claim("A", "0x1"), stat), None)
    assert free is not None and (free.state, free.generation) == (JobState.AVAILABLE, 3)
    done = to_record(paths, (dump_completed("A", "0x1", 2, "n", b"r"), stat), None)
    assert done is not None and (done.state, done.generation, done.result) == (
        JobState.COMPLETED, 2, b"r",
    )
    assert done.lease_until is None


def test_election_keys_live_apart_from_jobs() -> None:
    key = election_key("a/b")
    paths = job_paths("/c/jobs", "/c/elections", key)
    assert (paths.job_id, paths.job, paths.owner) == (
        key, "/c/elections/a%2Fb", "/c/elections/a%2Fb/owner",
    )
    assert job_paths("/c/jobs", "/c/elections", "a/b") == JobPaths.of("/c/jobs", "a/b")
    assert parse_member(member_name(7, "job")) == (7, "job")
    assert parse_member(member_name(7, key)) is None  # never a queue's job


@pytest.mark.parametrize("value", [b"", b"v", b"\n{\"vnonce\":1}\n", bytes(range(256))])
def test_owner_value_round_trips(value: bytes) -> None:
    data = dump_owner("A", "0x1", "claim-nonce", value, "value-nonce")
    owner = parse_owner(data, "/p/owner")
    assert (owner.owner, owner.nonce, owner.value, owner.value_nonce) == (
        "A", "claim-nonce", value, "value-nonce",
    )
    plain = parse_owner(dump_owner("A", "0x1", "claim-nonce"), "/p/owner")
    assert (plain.nonce, plain.value, plain.value_nonce) == ("claim-nonce", None, None)
    paths, stat = JobPaths.of("/c/jobs", "j"), SimpleNamespace(version=3)
    held = to_record(paths, (dump_claim("A", "0x1"), stat), (data, stat))
    assert held is not None and (held.state, held.value) == (JobState.HELD, value)
    free = to_record(paths, (dump_claim("A", "0x1"), stat), None)
    assert free is not None and free.value is None


def test_negotiated_timeout_is_captured_from_kazoos_log_call() -> None:
    capture = NegotiatedTimeouts()
    capture.log(logging.DEBUG, "Session created, session_id: %r ...", 0x10, b"pw", 4000, 1, 2)
    capture.log(logging.INFO, "unrelated %s", "x")
    assert capture.timeouts_ms == {0x10: 4000}
    assert session_text(0x10) == "0x0000000000000010"


# -- the job lifecycle ------------------------------------------------------------------------


def test_lifecycle_data_round_trips() -> None:
    assert dump_new(None) == b""
    assert parse_job(dump_new(3), "/p").max_attempts == 3
    held = parse_job(dump_claim("A", "0x1", 4, 5), "/p")
    assert (held.attempt, held.max_attempts) == (4, 5)
    done = parse_job(dump_completed("A", "0x1", 7, "n", b"r", 2, None), "/p")
    assert (done.attempt, done.max_attempts, done.result) == (2, None, b"r")
    stat = SimpleNamespace(version=3, mtime=1_700_000_000_123)
    for error in ("line 1\nline 2 \u00e9", None):
        written = Failure(False, 9, 2, 0.25, error, "n")
        read = parse_failure((dump_failure(written), stat), "/p/failure")
        assert read == Failure(False, 9, 2, 0.25, error, "n", 3, 1_700_000_000_123)
        assert read.not_before_ms == 1_700_000_000_373
        assert read.delaying(9) and not read.delaying(10)
    assert parse_delayed((dump_delayed(0.0011), stat), "/p") == 1_700_000_000_125
    with pytest.raises(CorruptData):
        parse_failure((b'{"format":1,"failed":false}\n', stat), "/p/failure")
    with pytest.raises(CorruptData):
        parse_job(b'{"format":1,"state":"held","attempt":-1}\n', "/p")


def test_lifecycle_records() -> None:
    paths = JobPaths.of("/c/jobs", "j")
    job = (dump_claim("A", "0x1", 2, 3), SimpleNamespace(version=2))
    stat = SimpleNamespace(version=1, mtime=10_000)
    retry = (dump_failure(Failure(False, 2, 0, 1.5, "boom", "n")), stat)
    record = to_record(paths, job, None, retry)
    assert record is not None and (record.state, record.attempt, record.max_attempts) == (
        JobState.AVAILABLE, 2, 3,
    )
    assert (record.error, record.not_before) == ("boom", 11.5)
    claimed_since = (dump_claim("B", "0x2", 3, 3), SimpleNamespace(version=3))
    record = to_record(paths, claimed_since, None, retry)
    assert record is not None and record.not_before is None and record.error == "boom"
    dead = (dump_failure(Failure(True, 2, 0, 0.0, "boom", "n")), stat)
    record = to_record(paths, job, None, dead)
    assert record is not None and record.state is JobState.FAILED and record.not_before is None


def test_marker_trouble_tells_markers_from_core_operations() -> None:
    markers = [("delete", "/q/held/m", b"", -1), ("create", "/q/delayed/m", b"", -1)]
    rolled = RolledBackError()
    missing = marker_trouble([rolled, rolled, NoNodeError(), rolled], 2, markers)
    assert (missing.only, missing.skip) == (True, {"/q/held/m"})
    exists = marker_trouble([rolled, rolled, rolled, NodeExistsError()], 2, markers)
    assert (exists.only, exists.skip) == (True, {"/q/delayed/m"})
    parent = marker_trouble([rolled, rolled, rolled, NoNodeError()], 2, markers)
    assert (parent.only, parent.skip, parent.parents) == (True, set(), {"/q/delayed"})
    core = marker_trouble([BadVersionError(), rolled, rolled, rolled], 2, markers)
    assert not core.only and not core.skip
    assert not marker_trouble([], 2, markers).only  # a lost answer says nothing


# -- the store epoch and the store's history ---------------------------------------------------


def test_tokens_fold_the_epoch_into_the_version() -> None:
    assert token(0, 7) == 7 and split_token(7) == (0, 7)
    assert token(3, 2**31 - 1) == 3 * 2**32 + 2**31 - 1
    assert split_token(token(2**31 - 1, 5)) == (2**31 - 1, 5) and token(2**31 - 1, 2**31) < 2**63
    assert parse_epoch(b"", "/e") == 0 and parse_epoch(b"0", "/e") == 0
    assert parse_epoch(dump_epoch(12, "abc"), "/e") == 12
    for bad in (b"x", b"-1", str(2**31).encode()):
        with pytest.raises(CorruptData):
            parse_epoch(bad, "/e")
    assert dump_claim("A", "0x1", 1) == dump_claim("A", "0x1", 1, epoch=0)  # epoch 0: as ever
    paths = JobPaths.of("/c/jobs", "j")
    stat = SimpleNamespace(version=4)
    held = to_record(paths, (dump_claim("A", "0x1", 2, epoch=3), stat), None)
    assert held is not None and held.generation == 3 * 2**32 + 4
    done = to_record(paths, (dump_completed("A", "0x1", 4, "n", b"", 2, None, 3),
                             SimpleNamespace(version=5)), None)
    assert done is not None and done.generation == 3 * 2**32 + 4


def history() -> tuple[History, list[StoreRegressed]]:
    told: list[StoreRegressed] = []
    return History("h:1", told.append), told


def test_a_write_answered_below_a_zxid_seen_before_is_a_regression() -> None:
    seen, told = history()
    seen.saw(100)
    seen.saw(40)  # a read from a lagging follower: only noted
    assert seen.highest() == 100 and not seen.regressed
    seen.answered(101, seen.highest(), "keepalive")
    assert not told
    seen.answered(7, 101, "keepalive")
    assert seen.regressed and len(told) == 1 and "0x7" in str(told[0])
    seen.answered(3, 101, "claim")
    assert len(told) == 1  # told once
    error = seen.error()
    assert isinstance(error, StoreRegressed) and error is not told[0]


def test_identity_gone_or_changed_and_epoch_gone_back_are_regressions() -> None:
    for found in (None, (b"other", None)):
        seen, told = history()
        seen.identity_seen((b"mine", None), "open")
        seen.identity_seen((b"mine", None), "keepalive")
        assert not told
        seen.identity_seen(found, "keepalive")
        assert len(told) == 1
    seen, told = history()
    seen.epoch_seen(2, 5, "open")
    seen.epoch_seen(2, 4, "open")  # an older read of the same epoch: kept the newer
    assert seen.epoch() == (2, 5) and not told
    seen.epoch_seen(1, 9, "claim")
    assert len(told) == 1
    seen, told = history()
    seen.epoch_seen(0, 0, "open")
    assert seen.epoch_gone("claim") and seen.epoch() is None and not told
    seen.epoch_seen(1, 1, "claim")
    assert not seen.epoch_gone("claim") and len(told) == 1


def test_a_regressed_history_recovers_only_once_the_epoch_was_raised() -> None:
    seen, told = history()
    seen.identity_seen((b"old", None), "open")
    seen.epoch_seen(1, 3, "open")
    seen.saw(500)
    seen.identity_seen(None, "probe")
    assert seen.regressed
    assert not seen.recover((1, 0), (b"new", None), 9)  # same epoch: tokens could repeat
    assert seen.recover((2, 1), (b"new", None), 9)
    assert not seen.regressed and seen.highest() == 9 and seen.epoch() == (2, 1)
    seen.identity_seen((b"new", None), "keepalive")
    seen.answered(10, 9, "keepalive")
    assert len(told) == 1


def test_queue_head_round_trips_and_layout_1_is_told_apart() -> None:
    head = QueueHead(seq=300, jobs=290, payload_bytes=1234)
    assert QueueHead.parse(head.dump(), "/q", "q") == head
    assert head.last_bucket == 1 and QueueHead().last_bucket == -1
    assert [bucket_of(s) for s in (1, BUCKET_JOBS, BUCKET_JOBS + 1)] == [0, 0, 1]
    with pytest.raises(LegacyQueueLayout, match="upgrade step") as legacy:
        QueueHead.parse(b"", "/c/queues/q", "q")  # layout 1: the head had no data
    assert isinstance(legacy.value, UnsupportedOperation)
    assert "deleteall /c/queues/q" in str(legacy.value)
    for foreign in (b"{}", b'{"layout":3,"seq":1,"jobs":1,"bytes":0}',
                    b'{"layout":2,"seq":-1,"jobs":1,"bytes":0}', b"junk"):
        with pytest.raises(CorruptData):
            QueueHead.parse(foreign, "/q", "q")


def test_queue_tags_name_their_bucket_and_layout_1_tags_keep_the_flat_paths() -> None:
    member = member_name(BUCKET_JOBS + 1, "j")
    tag = QueueTag("q", member, "n", 1)
    assert QueueTag.parse(tag.dump(), "/t") == tag
    assert tag.marker("/c/queues") == f"/c/queues/q/b/0000000001/open/{member}"
    assert tag.held("/c/queues") == f"/c/queues/q/b/0000000001/held/{member}"
    assert tag.failed("/c/queues") == f"/c/queues/q/b/0000000001/failed/{member}"
    tally = tag.tally("/c/queues")
    assert tally is not None and tally.done == f"/c/queues/q/tally/done/{member}"
    bucket = QueuePaths.of("/c/queues", "q").bucket(1)
    assert bucket.marker(member) == tag.marker("/c/queues")
    old = QueueTag.parse(b'{"format":1,"queue":"q","member":"' + member.encode()
                         + b'","nonce":"n"}', "/t")
    assert old.bucket is None and old.failed("/c") is None and old.tally("/c") is None
    assert old.marker("/c/queues") == f"/c/queues/q/open/{member}"


# -- what the backend knows of jobs without reading (_jobs_known) ---------------------------------


def _released(version: int) -> Released:
    return Released(0, version, version, None, None, None, None, None, None, None)


def test_known_jobs_seen_released_stale_and_bounded() -> None:
    known = Known(limit=3)
    assert known.get("a") is UNSEEN
    known.released("a", _released(4))
    known.seen(["a", "b"])  # seen does not forget a release
    assert known.get("a") == _released(4) and known.get("b") is None
    known.stale(["a"])  # a failed guess, a claim: read next time
    assert known.get("a") is None
    known.seen(["c", "d"])  # over the limit: the oldest ("b") is forgotten
    assert known.get("b") is UNSEEN and known.get("d") is None
    known.clear()
    assert known.get("a") is UNSEEN


@pytest.mark.parametrize("acl", [None, [make_acl("world", "anyone", read=True)]])
def test_lean_operations_are_the_records_kazoo_makes(acl: list[Any] | None) -> None:
    """``_transport_multi.Lean`` skips kazoo's per-operation checks and path normalisation: for our
    (absolute, normalised) paths on a client without a chroot of its own, the records
    are kazoo's own."""
    client = KazooClient(hosts="127.0.0.1:1", default_acl=acl)
    ours, kazoos = client.transaction(), client.transaction()
    for tx in (Lean(ours), kazoos):
        tx.check("/c/epoch", 3)
        tx.create("/c/jobs/a%2Eb", b"")
        tx.set_data("/c/jobs/a%2Eb", b"held", 0)
        tx.create("/c/jobs/a%2Eb/owner", b"me", ephemeral=True)
        tx.delete("/c/jobs/a%2Eb/owner", 2)
        tx.delete("/c/q/held/x")
    assert ours.operations == kazoos.operations
    with pytest.raises(ValueError):
        Lean(KazooClient(hosts="127.0.0.1:1/chroot").transaction())


# -- the connection thread's select ---------------------------------------------------------


def test_poll_select_answers_as_kazoos_select() -> None:
    """``_transport_kazoo.poll_select`` (one poll(2)) reports what kazoo's ``selector_select``
    does: readable (data, or the peer hung up), writable, nothing by the timeout; an
    object in both lists as readable if it is."""
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    try:
        cases: list[tuple[list[Any], list[Any]]] = [
            ([a, c], []), ([], [a]), ([a], [a]), ([a, c], [c]),
        ]
        for select in (poll_select, selector_select):
            assert select([a, c], [], [], 0) == ([], [], [])  # nothing to read yet
        b.send(b"x")
        d.close()  # c's peer hung up: readable (its recv returns b"")
        for rlist, wlist in cases:
            expected = selector_select(rlist, wlist, [], 0.5)
            got = poll_select(rlist, wlist, [], 0.5)
            assert got == expected, (rlist, wlist)
        assert poll_select([a, c], [], [], None) == ([a, c], [], [])
        start = time.monotonic()
        assert poll_select([b], [], [], 0.05) == ([], [], [])  # waits out the timeout
        assert time.monotonic() - start >= 0.04
    finally:
        for sock in (a, b, c, d):
            sock.close()


def test_poll_select_refuses_what_kazoos_select_refuses() -> None:
    closed = socket.socket()
    closed.close()  # fileno() -1
    with pytest.raises(TypeError):
        poll_select([closed], [], [], 0)
    with pytest.raises(TypeError):
        poll_select([object()], [], [], 0)
    with pytest.raises(TypeError):
        poll_select([], [], [], "1")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        poll_select([], [], [], -1)


def test_clients_wait_on_their_sockets_through_the_poll_handler() -> None:
    client = parse_url("zk://127.0.0.1:1/c", {}).new_client(10.0)
    assert isinstance(client.handler, PollHandler)
    assert client.handler.select([], [], [], 0) == ([], [], [])


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["check", "create", "ephemeral", "set_data", "delete"]),
        st.text(st.characters(blacklist_characters="/", blacklist_categories=("Cs",)), min_size=1, max_size=30)
        .map(lambda name: "/c/" + name),  # normalised, as the backend builds them
        st.binary(max_size=40),
        # None: "any version" (sent as -1, said so on purpose); a bare -1 is refused
        # before it is sent (test_zookeeper_counters.py::test_a_version_out_of_range_is_never_sent)
        st.one_of(st.none(), st.integers(min_value=0, max_value=2**31 - 1)),
    ),
    min_size=1, max_size=6,
)


@given(_OPS, st.sampled_from([None, [make_acl("world", "anyone", read=True)],
                              [make_acl("digest", "u:h\u00e9", all=True),
                               make_acl("world", "anyone", read=True)]]))
def test_packed_multis_are_the_bytes_kazoo_sends(
    ops: list[tuple[str, str, bytes, int | None]], acl: list[Any] | None
) -> None:
    """``_transport_multi.Transaction`` packs a multi as it is built: the bytes are those of kazoo's
    ``Transaction`` of the records kazoo's ``TransactionRequest`` makes, and its answer
    is decoded by kazoo's."""
    client = KazooClient(hosts="127.0.0.1:1", default_acl=acl)
    ours, kazoos = Transaction(client), client.transaction()
    for kind, path, data, version in ops:
        wire = -1 if version is None else version
        if kind == "check":
            ours.check(path, version)
            kazoos.check(path, wire)
        elif kind in ("create", "ephemeral"):
            ours.create(path, data, ephemeral=kind == "ephemeral")
            kazoos.create(path, data, ephemeral=kind == "ephemeral")
        elif kind == "set_data":
            ours.set_data(path, data, version)
            kazoos.set_data(path, data, wire)
        else:
            ours.delete(path, version)
            kazoos.delete(path, wire)
    assert ours.serialize() == bytes(KazooTransaction(kazoos.operations).serialize())
    assert ours.type == KazooTransaction.type and type(ours).__name__ == "Transaction"
    assert ours.op_types == [op.type for op in kazoos.operations]
    answer = bytes(KazooTransaction([]).serialize())  # an answer of no results
    assert ours.deserialize(answer, 0) == KazooTransaction.deserialize(answer, 0) == []
    with pytest.raises(ValueError):
        Transaction(KazooClient(hosts="127.0.0.1:1/chroot"))
