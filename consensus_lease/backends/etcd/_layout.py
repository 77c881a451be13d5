"""Key layout under the prefix, and the values stored at each key.

Each job owns up to ten keys under ``PREFIX/HEX/``, where ``HEX`` is the lowercase hex of
the job id's UTF-8 bytes. Hex cannot contain ``/``, so no id (``/``, ``..``, spaces,
any Unicode) can collide with another or reach outside its own directory, and hex
keeps the byte order of the ids: a key-ordered range read lists jobs in job-id order,
so ``records(limit)`` can stop early.

=======  ==========  ==========================================================
key      lease       meaning
=======  ==========  ==========================================================
``a``    none        ATTEMPTS: put by every claim (value: its epoch, empty for
                     0), so its ``version`` is the number of claims so far (the
                     attempt of the last one) and its ``mod_revision`` the last
                     claim's generation (below the epoch bits).
``c``    none        COMPLETION record; once written the job is never claimed
                     again. Written together with deleting ``o`` and ``h``.
``e``    none        LAST ERROR (:class:`LastError`): written by ``fail`` (and
                     by a claim that finds the attempts used up, if there was
                     none); kept across claims and requeues.
``f``    none        FAILED record (:class:`DeadLetter`): the job is a dead
                     letter, claimed again only after ``requeue`` deletes it.
``h``    none        HISTORY: written by every claim (same value as ``o``, so
                     its ``mod_revision`` is the generation) and by release and
                     fail (explicit generation, ``released``). Lets ``get`` tell
                     "released / expired at generation N" from "never seen".
``l``    none        LIMIT (:class:`Limit`): ``max_attempts`` and the attempt
                     count at the last requeue; written by ``enqueue`` only for
                     a job with a limit, rewritten by ``requeue``.
``n``    its own     NOT-BEFORE: exists while a retry delay of ``fail`` runs;
                     attached to a lease of its own, whose expiry deletes it.
``o``    session's   the OWNER key: exists iff a live session holds the job. Its
                     ``create_revision`` is the fencing token. etcd deletes it
                     when the session's lease ends (expiry or revoke).
``q``    none        QUEUE marker: the work queue the job was enqueued in
                     (:class:`QueueMarker`). Written by ``enqueue`` only while
                     the job has no other key, so it never changes while the
                     job exists; deleted by ``purge``.
``v``    session's   VALUE (:class:`HeldValue`): put by ``set_value`` while the
                     job is held, on the holder's lease, so it goes with the
                     hold on expiry; deleted by release, complete and fail of
                     an election. It records the generation it was set at:
                     one of an older hold is stale and never shown.
=======  ==========  ==========================================================

Elections (:mod:`consensus_lease._election`) are held through the same keys, under
``PREFIX/elections/NHEX/`` instead of ``PREFIX/HEX/`` (``NHEX``: hex of the election
name). ``elections`` is no canonical hex (``l`` is no hex digit), so no job directory
can be or contain it; it sorts between the job directories starting ``e`` and those
starting ``f``, so listings of the jobs skip it (:meth:`Layout.parse` names its keys by
their election key, ``"\x1fe:" + name``).

The claim that writes ``o`` and ``h`` records in their value the store epoch in
effect (see :mod:`._tokens`; omitted when 0), and puts it as the value of ``a`` (empty
for 0), so the token of that claim, ``epoch * 2**44 + create revision``, can be told
from the keys later (records, errors, the FAILED record a claim writes).

One key of the prefix is not a job's: ``PREFIX/epoch`` (:class:`StoreEpoch`), the
store epoch, absent until ``bump_epoch`` first runs. It has no ``/`` after the prefix,
so :meth:`Layout.parse` leaves it out.

Each open session has one key of its own, ``PREFIX/sessions/LEASE`` (``LEASE``: the
lease id as 16 lowercase hex digits; value: the owner label), attached to its lease and
put when the session is opened: etcd deletes it in the same revision as every other key
of the lease when the lease ends (expiry or revoke), so one watch of ``PREFIX/sessions/``
tells a process that a session of its own ended (see :mod:`._sessions_revocation`). Nothing else
deletes it; deleting it by hand ends that session as a revoke would. ``sessions`` is no
hex either, and sorts after ``q``: outside the job range.

The suffixes sort ``a < c < e < f < h < l < n < o < q < v``, so one watch on
``[c, o\\0)`` sees every change that can make a job claimable (owner and not-before
deleted, completion, failure, requeue); an election's watch reaches to ``v`` (a new
leader and its value are changes to observe too). A claim's snapshot (its ``else``
branch) reads ``[a, q\\0)``, without the value. Job directories are hex (and
``elections``), so every job key sorts before ``PREFIX/g``.

Work queues live after them, in ``QDIR`` = ``PREFIX/q/QHEX/`` (``QHEX``: hex of the
queue name, so queue directories cannot nest either):

===============  ======  ====================================================
key              value   meaning
===============  ======  ====================================================
``QDIR/j/HEX``   payload MEMBER: the job belongs to the queue. Its
                         ``create_revision`` (the enqueue transaction's
                         revision) is the job's ``seq``, the FIFO order. Kept
                         until ``purge``.
``QDIR/p/HEX``   ORD     PENDING: the job is neither completed nor FAILED; its
                         value is the job's current ordinal ``ORD`` (20 decimal
                         digits). Created with the member key; deleted by the
                         completion transaction and by the one that makes the
                         job FAILED; created again by ``requeue`` with a new
                         ordinal. What wakes queue waiters (watched).
``QDIR/i/ORD/HEX`` empty INDEX entry: ``ORD`` is the job's place in the queue,
                         so key order is FIFO order. Created with the pending
                         key (whose value names it); deleted by the completion
                         or FAILED verdict of a claim that read the ordinal.
                         An entry whose pending key is gone or names another
                         ordinal is *stale*, for good (ordinals are never
                         reused), and candidate scans (and purge) delete it.
``QDIR/h/HEX``   empty   HELD marker, on the holder's lease: put by a claim of
                         a queued job, deleted by its completion, release and
                         fail, and by etcd with the lease. Counted for
                         ``queue_stats``.
``QDIR/k/seq``   ORD/B   the next ordinal and the payload bytes enqueued so far:
                         every enqueue and requeue takes the next ordinals by
                         comparing this value and writing it back in the same
                         transaction (so ordinals follow commit order and have
                         no gaps).
``QDIR/k/low``   ORD     the low-water mark: no live index entry is below it.
                         Raised (never lowered) by candidate scans.
``QDIR/k/done``  empty   counters kept by the version of a key that a
``QDIR/k/failed``        transaction puts blindly (no compare, so concurrent
``QDIR/k/requeued``      writers never conflict): completions, FAILED
                         verdicts, requeues. The items of one
                         ``complete_many`` (``fail_many``) transaction at
                         positions 1 and up put the shards
                         ``QDIR/k/done/NNN`` (``QDIR/k/failed/NNN``) instead
                         (etcd refuses a transaction putting one key twice);
                         ``queue_stats`` sums them with ``done`` (``failed``).
``QDIR/k/purged`` N/B    jobs and payload bytes purged (compared and rewritten
                         by purge).
``QDIR/k/base``  JSON    completed and FAILED jobs an upgrade from the first
                         layout found (they have no ordinal).
===============  ======  ====================================================

A queue without ``QDIR/k/seq`` but with member keys was written by the first layout
(pending keys without ordinals, found by a range sorted by create revision); the driver
refuses it (:func:`._queues_index.layout_refused`) until ``upgrade_queue`` has rewritten
it (:mod:`._queues_upgrade`).

Values other than payloads are compact JSON (UTF-8), ``result`` base64; anything that
does not parse is reported as corrupt instead of guessed at.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass
from json.encoder import encode_basestring as _encode_basestring
from typing import Any

from ..._election import election_key, election_name, is_election_key
from ...errors import BackendUnavailable

__all__ = [
    "Completion",
    "DeadLetter",
    "HeldValue",
    "History",
    "JobKeys",
    "LastError",
    "Layout",
    "Limit",
    "Owner",
    "QueueKeys",
    "QueueMarker",
    "StoreEpoch",
    "attempts_epoch",
    "attempts_of",
    "attempts_value",
    "free_range",
    "limit_of",
    "ordinal_bytes",
    "ordinal_of",
    "pair_bytes",
    "pair_of",
    "prefix_range_end",
    "queue_of",
]

ATTEMPTS = b"a"
COMPLETION = b"c"
ERROR = b"e"
FAILED = b"f"
HISTORY = b"h"
LIMIT = b"l"
NOT_BEFORE = b"n"
OWNER = b"o"
QUEUE = b"q"
VALUE = b"v"
JOB_KINDS = frozenset({ATTEMPTS, COMPLETION, ERROR, FAILED, HISTORY, LIMIT, NOT_BEFORE, OWNER,
                       QUEUE, VALUE})
ELECTIONS = b"elections/"  # no canonical hex: no job directory is or contains it
EPOCH = b"epoch"
SESSIONS = b"sessions/"  # no canonical hex; after JOBS_END and QUEUE
_HEX_DIGITS = b"0123456789abcdef"
MEMBER = b"j/"
PENDING = b"p/"
HELD = b"h/"
INDEX = b"i/"
COUNTERS = b"k/"
ORDINAL_DIGITS = 20
JOBS_END = b"g"  # after every hex digit and "elections": [root, root + "g") holds exactly
# the job keys (elections' included)


def _hex(text: str) -> bytes:
    return text.encode("utf-8").hex().encode("ascii")


def _unhex(raw: bytes) -> str | None:
    """The text whose canonical (lowercase) hex is ``raw``, else ``None``."""
    try:
        text = bytes.fromhex(raw.decode("ascii"))
        if not raw or text.hex().encode("ascii") != raw:
            return None
        return text.decode("utf-8")
    except (UnicodeDecodeError, ValueError):
        return None


def free_range(base: bytes) -> tuple[bytes, bytes]:
    """``(key, range_end)`` from the limit key ``l`` through the owner key ``o`` of the
    job whose keys start with ``base``: of the job's kinds, exactly the limit,
    not-before and owner keys sort there, the three a common claim needs absent
    besides the completion. (Were a prefix nested in ours against the rules, the range
    could also hold such a prefix's keys, as :attr:`JobKeys.directory` does.)"""
    return base + LIMIT, base + OWNER + b"\x00"


def prefix_range_end(prefix: bytes) -> bytes:
    """The etcd ``range_end`` that selects every key starting with ``prefix``."""
    end = bytearray(prefix)
    for i in reversed(range(len(end))):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\x00"  # all 0xff: to the end of the keyspace


@dataclass(frozen=True, slots=True)
class JobKeys:
    """The keys of one job, and the store's epoch key (read with them by claims);
    ``is_election``: whether these are an election's keys (``job_id`` is an election
    key), told once by :meth:`Layout.job`."""

    job_id: str
    base: bytes
    epoch: bytes
    is_election: bool = False

    @property
    def owner(self) -> bytes:
        return self.base + OWNER

    @property
    def history(self) -> bytes:
        return self.base + HISTORY

    @property
    def completion(self) -> bytes:
        return self.base + COMPLETION

    @property
    def queue(self) -> bytes:
        """The queue marker (see :class:`QueueMarker`)."""
        return self.base + QUEUE

    @property
    def attempts(self) -> bytes:
        return self.base + ATTEMPTS

    @property
    def error(self) -> bytes:
        return self.base + ERROR

    @property
    def failed(self) -> bytes:
        return self.base + FAILED

    @property
    def limit(self) -> bytes:
        return self.base + LIMIT

    @property
    def not_before(self) -> bytes:
        return self.base + NOT_BEFORE

    @property
    def value(self) -> bytes:
        """The value key (:class:`HeldValue`), put by ``set_value``."""
        return self.base + VALUE

    @property
    def directory(self) -> tuple[bytes, bytes]:
        """``(key, range_end)`` covering every key of the job, ``a`` to ``q``, but not the
        value (what a claim's snapshot reads). (Were a prefix nested in ours against the
        rules, it would also hold that prefix's job keys, which :meth:`Layout.parse`
        leaves out, but none of its queue keys.)"""
        return self.base + ATTEMPTS, self.base + QUEUE + b"\x00"

    @property
    def record_range(self) -> tuple[bytes, bytes]:
        """``(key, range_end)`` covering every key of the job, ``a`` to ``v`` (what
        ``get`` reads)."""
        return self.base + ATTEMPTS, self.base + VALUE + b"\x00"

    def kind_of(self, key: bytes) -> bytes | None:
        """The kind (``a`` ... ``q``) of ``key`` if it is one of this job's keys, else
        ``None`` (e.g. a nested prefix's key inside :attr:`directory`)."""
        if not key.startswith(self.base):
            return None
        kind = key[len(self.base) :]
        return kind if kind in JOB_KINDS else None

    @property
    def watch_range(self) -> tuple[bytes, bytes]:
        """``(key, range_end)`` covering the completion, error, failed, history, limit,
        not-before and owner keys; for an election, the value key too."""
        return self.completion, (self.value if self.is_election else self.owner) + b"\x00"


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """The keys of one work queue: ``base`` is ``PREFIX/q/QHEX/``."""

    queue: str
    base: bytes

    def member(self, job_id: str) -> bytes:
        return self.base + MEMBER + _hex(job_id)

    def pending(self, job_id: str) -> bytes:
        return self.base + PENDING + _hex(job_id)

    @property
    def members(self) -> tuple[bytes, bytes]:
        """``(key, range_end)`` of every member key."""
        return self.base + MEMBER, prefix_range_end(self.base + MEMBER)

    @property
    def pendings(self) -> tuple[bytes, bytes]:
        """``(key, range_end)`` of every pending key."""
        return self.base + PENDING, prefix_range_end(self.base + PENDING)

    def job_of(self, key: bytes) -> str | None:
        """The job id of a member or pending key of this queue, else ``None``."""
        for kind in (MEMBER, PENDING):
            if key.startswith(self.base + kind):
                return _unhex(key[len(self.base) + len(kind) :])
        return None

    def held(self, job_id: str) -> bytes:
        """The held marker (on the holder's lease)."""
        return self.base + HELD + _hex(job_id)

    @property
    def helds(self) -> tuple[bytes, bytes]:
        """``(key, range_end)`` of every held marker."""
        return self.base + HELD, prefix_range_end(self.base + HELD)

    def entry(self, ordinal: int, job_id: str) -> bytes:
        """The index entry of ``job_id`` at ``ordinal``."""
        return self.base + INDEX + ordinal_bytes(ordinal) + b"/" + _hex(job_id)

    def entries(self, low: int, high: int) -> tuple[bytes, bytes]:
        """``(key, range_end)`` of the index entries with ordinals in ``[low, high)``."""
        return (self.base + INDEX + ordinal_bytes(low),
                self.base + INDEX + ordinal_bytes(high))

    def entry_of(self, key: bytes) -> tuple[int, str] | None:
        """``(ordinal, job_id)`` of an index entry of this queue, else ``None``."""
        if not key.startswith(self.base + INDEX):
            return None
        digits, sep, hex_id = key[len(self.base) + len(INDEX) :].partition(b"/")
        job_id = _unhex(hex_id)
        if not sep or len(digits) != ORDINAL_DIGITS or not digits.isdigit() or job_id is None:
            return None
        return int(digits), job_id

    def counter(self, name: str) -> bytes:
        """A counter key: ``seq``, ``low``, ``done``, ``failed``, ``requeued``,
        ``purged``."""
        return self.base + COUNTERS + name.encode("ascii")

    def done(self, position: int) -> bytes:
        """The completed counter a completion bumps: :meth:`shard` of ``done``."""
        return self.shard("done", position)

    def shard(self, name: str, position: int) -> bytes:
        """The counter ``name`` (``done``, ``failed``) an item bumps (a put: its version
        counts): the one of a transaction's ``position`` (0 to 999) among the items of
        one batch transaction (``complete_many``, ``fail_many``), which must each put a
        key of their own: ``QDIR/k/NAME`` for position 0 (a lone operation), its shard
        ``QDIR/k/NAME/NNN`` (three digits) for the others."""
        return self.counter(name) + (b"/%03d" % position if position else b"")

    @property
    def done_shards(self) -> tuple[bytes, bytes]:
        """``(key, range_end)`` of the completed counter's shards."""
        return self.shards("done")

    def shards(self, name: str) -> tuple[bytes, bytes]:
        """``(key, range_end)`` of the counter ``name``'s shards (:meth:`shard` of
        positions 1 and up)."""
        start = self.counter(name + "/")
        return start, prefix_range_end(start)


def ordinal_bytes(ordinal: int) -> bytes:
    """An ordinal as stored: 20 decimal digits, so byte order is numeric order."""
    return b"%020d" % ordinal


def pair_bytes(first: int, second: int) -> bytes:
    """Two counters in one value (``seq``: ordinals and payload bytes enqueued;
    ``purged``: jobs and payload bytes purged), each as 20 decimal digits."""
    return b"%020d/%020d" % (first, second)


def pair_of(kv: Any) -> tuple[int, int]:
    """The two counters of a :func:`pair_bytes` value (absent: zeros).

    Raises:
        BackendUnavailable: the value is not a pair of counters.
    """
    if kv is None:
        return 0, 0
    raw = bytes(kv.value)
    first, sep, second = raw.partition(b"/")
    if not sep or not first.isdigit() or not second.isdigit():
        raise BackendUnavailable(f"corrupt counter at etcd key {bytes(kv.key)!r}: {raw[:50]!r}")
    return int(first), int(second)


def ordinal_of(kv: Any) -> int | None:
    """The ordinal stored in a pending or counter key's key-value (``None``: absent,
    or a pending key of the first layout, which has an empty value).

    Raises:
        BackendUnavailable: the value is not an ordinal.
    """
    if kv is None or not kv.value:
        return None
    raw = bytes(kv.value)
    if len(raw) != ORDINAL_DIGITS or not raw.isdigit():
        raise BackendUnavailable(f"corrupt ordinal at etcd key {bytes(kv.key)!r}: {raw[:40]!r}")
    return int(raw)


class Layout:
    """Maps job ids to keys under one prefix (``b"/jobs"`` -> ``/jobs/<hex>/o``)."""

    def __init__(self, prefix: bytes) -> None:
        self.root = prefix.rstrip(b"/") + b"/"
        self._epoch_key = self.root + EPOCH
        self._last: JobKeys | None = None

    def job(self, job_id: str) -> JobKeys:
        """The keys of ``job_id``: ``PREFIX/HEX/...``, or ``PREFIX/elections/NHEX/...``
        for an election key. The last job's keys are kept (one atomic reference, so
        thread-safe): a claim's complete, release or renew finds them there."""
        last = self._last
        if last is not None and last.job_id == job_id:
            return last
        if is_election_key(job_id):
            keys = JobKeys(job_id, self.elections + _hex(election_name(job_id)) + b"/",
                           self._epoch_key, is_election=True)
        else:
            keys = JobKeys(job_id, self.root + _hex(job_id) + b"/", self._epoch_key)
        self._last = keys
        return keys

    @property
    def elections(self) -> bytes:
        """Where elections live: ``PREFIX/elections/``."""
        return self.root + ELECTIONS

    @property
    def epoch(self) -> bytes:
        """The store epoch's key, ``PREFIX/epoch``."""
        return self.root + EPOCH

    def session(self, lease_id: int) -> bytes:
        """The session key of lease ``lease_id``: ``PREFIX/sessions/`` + 16 hex digits."""
        return self.root + SESSIONS + b"%016x" % lease_id

    @property
    def sessions(self) -> tuple[bytes, bytes]:
        """``(key, range_end)`` of every session key."""
        start = self.root + SESSIONS
        return start, prefix_range_end(start)

    def session_lease(self, key: bytes) -> int | None:
        """The lease id a session key names; ``None`` for any other key."""
        start = self.root + SESSIONS
        rest = key[len(start):]
        if not key.startswith(start) or len(rest) != 16 or rest.strip(_HEX_DIGITS):
            return None
        return int(rest, 16)

    def queue(self, queue: str) -> QueueKeys:
        return QueueKeys(queue, self.root + QUEUE + b"/" + _hex(queue) + b"/")

    @property
    def range_end(self) -> bytes:
        return prefix_range_end(self.root)

    @property
    def jobs_range_end(self) -> bytes:
        """``range_end`` of ``[root, ...)`` covering every job key (elections' too) and
        nothing of the queues (``PREFIX/q/...``)."""
        return self.root + JOBS_END

    def parse(self, key: bytes) -> tuple[str, bytes] | None:
        """``(job_id, kind)`` for one of our job keys (``job_id`` an election key for an
        election's), ``None`` for anything else under the prefix (queue keys, a nested
        prefix's keys)."""
        if not key.startswith(self.root):
            return None
        election = key.startswith(self.elections)
        rest = key[len(self.elections if election else self.root) :]
        hex_id, sep, kind = rest.partition(b"/")
        if not sep or kind not in JOB_KINDS:
            return None
        name = _unhex(hex_id)  # only our canonical lowercase hex
        if name is None:
            return None
        return (election_key(name) if election else name), kind


def _dump(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _quote(text: str) -> str:
    """``text`` as a JSON string, as :func:`_dump` writes one (``ensure_ascii=False``:
    the json module's own C-accelerated quoting)."""
    return _encode_basestring(text)


def _load(raw: bytes, what: str, key: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BackendUnavailable(f"corrupt {what} record at etcd key {key!r}: {exc}") from exc
    if not isinstance(obj, dict):
        raise BackendUnavailable(f"corrupt {what} record at etcd key {key!r}: not an object")
    return obj


@dataclass(frozen=True, slots=True)
class HeldValue:
    """The value key's value: what ``set_value`` stored, the generation (token) of the
    hold it belongs to, and the request that wrote it (its nonce settles a lost
    answer)."""

    value: bytes
    generation: int
    nonce: str

    def encode(self) -> bytes:
        return _dump({"generation": self.generation, "nonce": self.nonce,
                      "value": base64.b64encode(self.value).decode("ascii")})

    @classmethod
    def decode(cls, raw: bytes, key: bytes) -> HeldValue:
        obj = _load(raw, "value", key)
        try:
            return cls(base64.b64decode(obj["value"], validate=True), int(obj["generation"]),
                       str(obj["nonce"]))
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise BackendUnavailable(f"corrupt value record at etcd key {key!r}") from exc


def session_text(lease_id: int) -> str:
    """A lease id as etcdctl prints it (lowercase hex): the session id."""
    return f"{lease_id:x}"


def _epoch_field(obj: dict[str, Any]) -> int:
    """The optional ``epoch`` of a record (absent: 0)."""
    epoch = int(obj.get("epoch", 0))
    if epoch < 0:
        raise ValueError(f"negative epoch {epoch}")
    return epoch


@dataclass(frozen=True, slots=True)
class Owner:
    """The owner key's value: who claimed, under which lease, with which request, in
    which store epoch (0: the field is left out, as before epochs existed)."""

    owner: str
    session: str
    nonce: str
    epoch: int = 0

    def encode(self) -> bytes:
        """The JSON object ``{"epoch", "nonce", "owner", "session"}`` (``epoch`` left out
        when 0), byte for byte what :func:`_dump` makes of it (sorted keys, no spaces),
        written out directly: a claim encodes one per request."""
        head = f'{{"epoch":{int(self.epoch)},' if self.epoch else "{"
        return (f'{head}"nonce":{_quote(self.nonce)},"owner":{_quote(self.owner)},'
                f'"session":{_quote(self.session)}}}').encode()

    @staticmethod
    def encoder(owner: str, session: str) -> Callable[[str, int], bytes]:
        """``encode(nonce, epoch)``: :meth:`encode` of ``Owner(owner, session, nonce,
        epoch)``, byte for byte, with the part after the nonce made once."""
        tail = f',"owner":{_quote(owner)},"session":{_quote(session)}}}'.encode()

        def encode(nonce: str, epoch: int) -> bytes:
            head = f'{{"epoch":{int(epoch)},"nonce":' if epoch else '{"nonce":'
            return (head + _quote(nonce)).encode() + tail

        return encode

    @classmethod
    def decode(cls, raw: bytes, key: bytes) -> Owner:
        obj = _load(raw, "owner", key)
        try:
            return cls(str(obj["owner"]), str(obj["session"]), str(obj["nonce"]),
                       _epoch_field(obj))
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendUnavailable(f"corrupt owner record at etcd key {key!r}") from exc


@dataclass(frozen=True, slots=True)
class History:
    """The history key's value. ``generation is None`` means "the claim that wrote
    this" (the owner value, with its ``epoch``): the generation is then the token of
    ``epoch`` and the key's ``mod_revision``."""

    owner: str | None
    session: str
    nonce: str
    generation: int | None = None
    released: bool = False
    epoch: int = 0

    def encode(self) -> bytes:
        """The JSON object ``{"generation", "nonce", "owner", "released", "session"}``
        (``generation`` left out when ``None``, ``released`` unless true), byte for byte
        what :func:`_dump` makes of it, written out directly (one per release)."""
        head = "{" if self.generation is None else f'{{"generation":{int(self.generation)},'
        owner = "null" if self.owner is None else _quote(self.owner)
        released = ',"released":true' if self.released else ""
        return (f'{head}"nonce":{_quote(self.nonce)},"owner":{owner}{released},'
                f'"session":{_quote(self.session)}}}').encode()

    @staticmethod
    def release_encoder(session: str) -> Callable[[str, int], bytes]:
        """``encode(nonce, generation)``: :meth:`encode` of the release marker
        ``History(None, session, nonce, generation, released=True)``, byte for byte,
        with the part after the nonce made once."""
        tail = f',"owner":null,"released":true,"session":{_quote(session)}}}'.encode()

        def encode(nonce: str, generation: int) -> bytes:
            return (f'{{"generation":{int(generation)},"nonce":' + _quote(nonce)).encode() + tail

        return encode

    @classmethod
    def decode(cls, raw: bytes, key: bytes) -> History:
        obj = _load(raw, "history", key)
        try:
            owner = obj["owner"]
            generation = obj.get("generation")
            return cls(
                None if owner is None else str(owner),
                str(obj["session"]),
                str(obj["nonce"]),
                None if generation is None else int(generation),
                bool(obj.get("released", False)),
                _epoch_field(obj),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendUnavailable(f"corrupt history record at etcd key {key!r}") from exc


@dataclass(frozen=True, slots=True)
class Completion:
    """The completion record's value."""

    owner: str
    session: str
    generation: int
    result: bytes

    def encode(self) -> bytes:
        """The JSON object ``{"generation", "owner", "result" (base64), "session"}``,
        byte for byte what :func:`_dump` makes of it, written out directly (one per
        completion)."""
        result = base64.b64encode(self.result).decode("ascii")
        return (f'{{"generation":{int(self.generation)},"owner":{_quote(self.owner)},'
                f'"result":"{result}","session":{_quote(self.session)}}}').encode()

    @classmethod
    def decode(cls, raw: bytes, key: bytes) -> Completion:
        obj = _load(raw, "completion", key)
        try:
            return cls(
                str(obj["owner"]),
                str(obj["session"]),
                int(obj["generation"]),
                base64.b64decode(obj["result"], validate=True),
            )
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise BackendUnavailable(f"corrupt completion record at etcd key {key!r}") from exc


@dataclass(frozen=True, slots=True)
class QueueMarker:
    """The queue marker's value: the job's queue, the enqueue request that wrote it
    (its nonce settles a lost answer) and the payload's size in bytes (0: left out, as
    before the queue's payload budget existed), which purge gives back."""

    queue: str
    nonce: str
    size: int = 0

    def encode(self) -> bytes:
        obj: dict[str, Any] = {"nonce": self.nonce, "queue": self.queue}
        if self.size:
            obj["size"] = self.size
        return _dump(obj)

    @classmethod
    def decode(cls, raw: bytes, key: bytes) -> QueueMarker:
        obj = _load(raw, "queue marker", key)
        try:
            return cls(str(obj["queue"]), str(obj["nonce"]), int(obj.get("size", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendUnavailable(f"corrupt queue marker at etcd key {key!r}") from exc


def queue_of(marker_kv: Any) -> str | None:
    """The work queue named by a queue marker's key-value (``None``: absent, not queued)."""
    if marker_kv is None:
        return None
    return QueueMarker.decode(marker_kv.value, marker_kv.key).queue


@dataclass(frozen=True, slots=True)
class Limit:
    """The limit key's value: the job's ``max_attempts`` and ``base``, the attempt count
    when the current budget began (0, or the attempts made before the last requeue);
    ``nonce`` names the request that wrote it (enqueue or requeue)."""

    max_attempts: int
    base: int
    nonce: str

    def exhausted(self, attempts: int) -> bool:
        """Every attempt of the current budget was made."""
        return attempts - self.base >= self.max_attempts

    def encode(self) -> bytes:
        return _dump({"base": self.base, "max_attempts": self.max_attempts, "nonce": self.nonce})

    @classmethod
    def decode(cls, raw: bytes, key: bytes) -> Limit:
        obj = _load(raw, "limit", key)
        try:
            return cls(int(obj["max_attempts"]), int(obj["base"]), str(obj["nonce"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendUnavailable(f"corrupt limit record at etcd key {key!r}") from exc


@dataclass(frozen=True, slots=True)
class LastError:
    """The last-error key's value: the error text, and the attempt it ended (``session``
    empty and ``generation`` the last claim's when a claim found the attempts used up);
    ``nonce`` names the request that wrote it, which settles a lost answer."""

    error: str
    session: str
    generation: int
    attempt: int
    nonce: str

    def encode(self) -> bytes:
        return _dump({"attempt": self.attempt, "error": self.error,
                      "generation": self.generation, "nonce": self.nonce,
                      "session": self.session})

    @classmethod
    def decode(cls, raw: bytes, key: bytes) -> LastError:
        obj = _load(raw, "error", key)
        try:
            return cls(str(obj["error"]), str(obj["session"]), int(obj["generation"]),
                       int(obj["attempt"]), str(obj["nonce"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendUnavailable(f"corrupt error record at etcd key {key!r}") from exc


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """The FAILED record's value: the last attempt (its generation and number) and the
    error that ended the job; ``nonce`` names the request that wrote it."""

    generation: int
    attempt: int
    error: str
    nonce: str

    def encode(self) -> bytes:
        return _dump({"attempt": self.attempt, "error": self.error,
                      "generation": self.generation, "nonce": self.nonce})

    @classmethod
    def decode(cls, raw: bytes, key: bytes) -> DeadLetter:
        obj = _load(raw, "failed", key)
        try:
            return cls(int(obj["generation"]), int(obj["attempt"]), str(obj["error"]),
                       str(obj["nonce"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendUnavailable(f"corrupt failed record at etcd key {key!r}") from exc


@dataclass(frozen=True, slots=True)
class StoreEpoch:
    """The epoch key's value: the store epoch, and the ``bump_epoch`` request that
    wrote it (its nonce settles a lost answer, and makes every value unique)."""

    epoch: int
    nonce: str

    def encode(self) -> bytes:
        return _dump({"epoch": self.epoch, "nonce": self.nonce})

    @classmethod
    def decode(cls, raw: bytes, key: bytes) -> StoreEpoch:
        obj = _load(raw, "epoch", key)
        try:
            return cls(_epoch_field(obj), str(obj["nonce"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendUnavailable(f"corrupt epoch record at etcd key {key!r}") from exc


def attempts_value(epoch: int) -> bytes:
    """What a claim in ``epoch`` puts in the attempts key (empty for epoch 0)."""
    return str(epoch).encode("ascii") if epoch else b""


def attempts_epoch(attempts_kv: Any) -> int:
    """The epoch of the last claim, from the attempts key's value (absent or empty: 0).

    Raises:
        BackendUnavailable: the value is not an epoch.
    """
    raw = b"" if attempts_kv is None else bytes(attempts_kv.value)
    if not raw:
        return 0
    if not raw.isdigit():
        raise BackendUnavailable(f"corrupt attempts key {attempts_kv.key!r}: {raw[:40]!r}")
    return int(raw)


def limit_of(limit_kv: Any) -> Limit | None:
    """The job's attempt limit from its limit key (``None``: absent, unlimited)."""
    if limit_kv is None:
        return None
    return Limit.decode(limit_kv.value, limit_kv.key)


def attempts_of(attempts_kv: Any) -> int:
    """The number of claims so far: the attempts key's version (0: absent)."""
    return 0 if attempts_kv is None else int(attempts_kv.version)
