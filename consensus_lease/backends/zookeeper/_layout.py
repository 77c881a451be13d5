"""Where a job lives in ZooKeeper and what its znodes hold.

::

    {chroot}/jobs                       persistent container; its data is unused, and a
                                        write to it (any version) reads the store's clock:
                                        the Stat.mtime the leader gives it (see ``clock``)
    {chroot}/epoch                      persistent, made (data b"0") when a backend first
                                        opens a session on the store
        data      = the store epoch in ASCII decimal (absent or empty: 0), then a space
                    and the nonce of the ``bump_epoch`` that wrote it
        version   = checked by every claim multi (the epoch each claim folds into its token)
    {chroot}/identity                   persistent, made once (a random uuid4 in hex, ASCII):
                                        a wiped or replaced store has none, or another one
    {chroot}/jobs/{name}                persistent job znode, one per job, deleted only
                                        by ``purge`` (a completed queued job)
        version   = the job's counter: +1 per claim; completion adds 1 more. The
                    generation (fencing token) is ``epoch * 2**32 + version``, with the
                    epoch the claim recorded in the data (0 if none)
        data      = b""                            never claimed (version 0), no limit
                    {"format":1,"state":"new","max_attempts":m}\\n     enqueued with a limit
                    {"format":1,"state":"held","attempt":n,...}\\n     last claim's owner,
                                                   session, attempt number (and limit),
                                                   and ``"epoch":e`` unless 0
                    {"format":1,"state":"completed","generation":g,...}\\n<result bytes>
                                                   (``g``: the version it completed at;
                                                   ``"epoch":e`` unless 0)
    {chroot}/jobs/{name}/owner          EPHEMERAL, exists while a live session holds the job
        ephemeralOwner = the holder's session id
        data      = {"owner":..., "session":..., "nonce":...}  (nonce: one per claim)
                    once ``set_value`` wrote a value (elections: the leader's value):
                    {"owner":..., "session":..., "nonce":..., "vnonce":...}\\n<value>
                    (vnonce: one per ``set_value`` call; the value goes with the hold)
    {chroot}/jobs/{name}/queue          persistent, queued jobs only (made by enqueue)
        data      = {"format":1,"queue":{qname},"member":{member},"nonce":...}
    {chroot}/jobs/{name}/failure        persistent, made by the job's first ``fail()`` (or
                                        by the claim that found its attempts used up)
        data      = {"format":1,"failed":bool,"generation":g,"base":b,"retry_in_s":d,
                     "nonce":...,"has_error":bool}\\n<error, UTF-8>
        mtime     = when it was last written, on the leader's clock: the start of the
                    retry delay ``d`` recorded at generation ``g``
        Written by ``fail`` (the last error; FAILED or a retry delay), by a claim that
        finds the attempts used up (FAILED), by ``requeue`` (not FAILED any more, attempt
        base ``b`` = the attempt then): never by anything else, always at the version
        read, and never bumping the job znode's version.

Work queues (``qname``: the queue name, encoded as job ids are), layout 2 (bucketed)::

    {chroot}/queues                     persistent container
    {chroot}/queues/{qname}             persistent, the queue's head
        data      = {"layout":2,"seq":s,"jobs":n,"bytes":b}: the last ``seq`` issued, the
                    jobs enqueued and not purged, and their payload bytes. Every enqueue
                    (or ``enqueue_many`` multi) writes it at the version it read, so seqs
                    are issued in order and the counts are exact (see :mod:`._queues`)
    {chroot}/queues/{qname}/h/{r}       persistent, the head once it has been rotated
                                        (``{r:010d}``, r = 1, 2, ...): the head's data
                                        as above. Rotation (before the head's 32-bit
                                        version reaches the limit, see :mod:`._queues`)
                                        writes ``{"layout":3,"head":r}`` into
                                        ``{qname}`` itself and moves the head to ``h/{r}``
                                        in one multi; each later rotation deletes
                                        ``h/{r}`` and makes ``h/{r+1}``. Releases before
                                        it read layout 3 as data they did not write and
                                        refuse the queue (they would not know the head)
    {chroot}/queues/{qname}/b           persistent container of the buckets
    {chroot}/queues/{qname}/tally/held/{member}    EPHEMERAL, made and deleted with the
                                        job's held marker (same multis, same session)
    {chroot}/queues/{qname}/tally/done/{member}    persistent, made by the completion
                                        multi, deleted by purge
    {chroot}/queues/{qname}/tally/failed/{member}  persistent, made and deleted with the
                                        job's failed marker
                                        The tallies are never listed: their parents'
                                        ``numChildren`` count the queue's held, completed
                                        and FAILED jobs in O(1) (``queue_stats``)
    {chroot}/queues/{qname}/b/{k}       bucket ``k`` (``{k:010d}``): the jobs with
                                        ``(seq - 1) // BUCKET_JOBS == k``, made (with its
                                        five children) by the multi issuing its first seq
    .../b/{k}/jobs/{member}             persistent, one per job enqueued (until purged)
        data      = the payload
    .../b/{k}/open/{member}             persistent, empty; deleted by the completion
                                        multi (and by the multi that makes the job FAILED;
                                        ``requeue`` makes it again), so its children are
                                        the jobs neither completed nor FAILED
    .../b/{k}/held/{member}             EPHEMERAL, empty, made by the claim multi with
                                        the owner znode, by the same session; deleted with
                                        it (release, completion, fail multis; session end)
    .../b/{k}/delayed/{member}          persistent, made by a ``fail()`` multi that sets a
                                        retry delay (same mtime as the failure znode),
                                        deleted by the job's next claim multi;
                                        data = {"format":1,"retry_in_s":d}
    .../b/{k}/failed/{member}           persistent, empty, made by the multi that makes
                                        the job FAILED, deleted by ``requeue``'s multi

``member`` is ``{seq:010d}-{name}``: sorting names sorts by ``seq`` (FIFO). A bucket holds
at most :data:`BUCKET_JOBS` members, so no listing of one of its directories exceeds
``BUCKET_JOBS`` names of at most 779 bytes (~200 KB, with the longest ids: far below
jute.maxbuffer); nothing ever lists a whole queue at once. The claimable jobs of a bucket
are the children of ``open`` less those of ``held``, and less those of ``delayed`` whose
delay has not passed on the store's clock. A job's tag names its bucket.

Layout 1 (before buckets; tags without a bucket) kept ``jobs``, ``open``, ``held`` and
``delayed`` directly under ``{qname}``, whose data was empty and whose version was the
last seq. A job of such a queue can still be claimed by name, completed, released,
failed and requeued (its tag gives the old paths), but queue operations (enqueue,
claim_next, queue_jobs, queue_stats, purge, waiting) refuse the queue with
:class:`LegacyQueueLayout`, naming the upgrade step.

Elections (an election key, :func:`consensus_lease._election.election_key`, in place of a
job id) live apart from the jobs, so they never show up in ``records()`` or queues, and
are otherwise laid out and handled exactly as a job::

    {chroot}/elections                  persistent container, made by the first claim of
                                        an election
    {chroot}/elections/{ename}          the election's job znode (``ename``: the election
                                        name, encoded as job ids are); its ``owner``
                                        child is the leader's, with the leader's value

``name`` is the job id percent-encoded from UTF-8 with every byte outside
``[A-Za-z0-9_~-]`` escaped (``.`` too), so ``/``, ``.``, ``..``, spaces, control or
non-ASCII characters can neither collide nor leave ``{chroot}/jobs``; decoding is exact.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from ..._election import election_name, is_election_key
from ...errors import BackendUnavailable, UnsupportedOperation
from ...record import JobState, LeaseRecord

__all__ = [
    "BUCKET_JOBS",
    "EPOCH_SHIFT",
    "FORMAT",
    "MAX_EPOCH",
    "BucketPaths",
    "Failure",
    "JobData",
    "JobPaths",
    "LegacyQueueLayout",
    "OwnerData",
    "QueueHead",
    "QueuePaths",
    "QueueTag",
    "Tally",
    "bucket_of",
    "decode_name",
    "delay_ms",
    "dump_claim",
    "dump_completed",
    "dump_delayed",
    "dump_epoch",
    "dump_failure",
    "dump_new",
    "dump_owner",
    "encode_job_id",
    "job_paths",
    "member_name",
    "new_nonce",
    "parse_delayed",
    "parse_epoch",
    "parse_failure",
    "parse_job",
    "parse_member",
    "parse_owner",
    "split_token",
    "to_record",
    "token",
    "written_by",
]

FORMAT = 1
EPOCH_SHIFT = 32
"""Tokens are ``epoch * 2**EPOCH_SHIFT + version``: a znode version is a signed 32-bit int."""
MAX_EPOCH = 2 ** (63 - EPOCH_SHIFT) - 1
"""The highest epoch: tokens stay below 2**63 (fences keep them as int64)."""
OWNER_NODE = "owner"
TAG_NODE = "queue"
FAILURE_NODE = "failure"
MEMBERS_DIR, OPEN_DIR, HELD_DIR, DELAYED_DIR = "jobs", "open", "held", "delayed"
FAILED_DIR, BUCKETS_DIR, TALLY_DIR, DONE_DIR = "failed", "b", "tally", "done"
LAYOUT = 2
"""The queue layout this code writes (the head's ``"layout"``)."""
ROTATED_LAYOUT = 3
"""The ``"layout"`` of a queue node whose head was rotated into ``{qname}/h/{r}``."""
HEAD_DIR = "h"
BUCKET_JOBS = 256
"""Jobs (seqs) per bucket: a listing of one of a bucket's directories has at most this
many names (each at most 779 bytes: ~200 KB worst case, ~35 KB with 120-character ids)."""
BUCKET_DIGITS = 10
SEQ_DIGITS = 10
"""A znode version is a signed 32-bit int: at most 2**31 - 1, ten digits."""


class CorruptData(BackendUnavailable):
    """A znode in our namespace holds data consensus_lease did not write."""


class LegacyQueueLayout(UnsupportedOperation):
    """The queue was written by consensus_lease before the bucketed layout (layout 1).
    Its jobs can still be claimed by name, completed, released, failed and requeued;
    queue operations refuse it. Nothing was sent or changed."""

    def __init__(self, path: str, queue: str) -> None:
        super().__init__(
            f"queue {queue!r} ({path}) uses the pre-bucket layout 1 of consensus_lease "
            f"< 15, whose whole-queue listings can exhaust the server; upgrade step: "
            f"drain it with the previous release (every job completed or FAILED), purge "
            f"it, then delete {path} (zkCli.sh: deleteall {path}) and enqueue again (or "
            f"enqueue new work under another queue name)")


def encode_job_id(job_id: str) -> str:
    """The znode name for ``job_id`` (valid ids only: see ``check_job_id``)."""
    if _UNESCAPED(job_id):
        return job_id  # what quote() gives too: nothing in it is escaped
    return quote(job_id, safe="").replace(".", "%2E")


_UNESCAPED = re.compile(r"[A-Za-z0-9_~-]+").fullmatch
"""Whether a job id is its own znode name (no byte of it is escaped)."""


def decode_name(name: str) -> str | None:
    """The job id a znode name encodes, or ``None`` for a name we never make."""
    try:
        job_id = unquote(name, errors="strict")
    except UnicodeDecodeError:
        return None
    return job_id if job_id and encode_job_id(job_id) == name else None


@dataclass(frozen=True, slots=True)
class JobPaths:
    job_id: str
    job: str
    owner: str
    tag: str  # the queue tag of a queued job
    failure: str  # the last failure, FAILED flag and attempt base (made by the first fail)

    @classmethod
    def of(cls, base: str, job_id: str) -> JobPaths:
        """The znodes of ``job_id`` under ``base`` (``{chroot}/jobs``)."""
        return cls.at(f"{base}/{encode_job_id(job_id)}", job_id)

    @classmethod
    def at(cls, job: str, job_id: str) -> JobPaths:
        """The znodes of ``job_id`` whose job znode is ``job``."""
        return cls(job_id, job, f"{job}/{OWNER_NODE}", f"{job}/{TAG_NODE}",
                   f"{job}/{FAILURE_NODE}")


def job_paths(base: str, elections_base: str, job_id: str) -> JobPaths:
    """The znodes of ``job_id``: under ``base`` (``{chroot}/jobs``) for a job, under
    ``elections_base`` (``{chroot}/elections``, named after the election's name) for an
    election key."""
    if is_election_key(job_id):
        return JobPaths.at(f"{elections_base}/{encode_job_id(election_name(job_id))}", job_id)
    return JobPaths.of(base, job_id)


@dataclass(frozen=True, slots=True)
class BucketPaths:
    """One bucket's znodes (see the module docstring)."""

    index: int
    node: str
    members: str
    open: str
    held: str
    delayed: str
    failed: str

    def dirs(self) -> tuple[str, str, str, str, str, str]:
        """The bucket and its directories, parents first (as the enqueue multi makes them)."""
        return (self.node, self.members, self.open, self.held, self.delayed, self.failed)

    def member(self, member: str) -> str:
        return f"{self.members}/{member}"

    def marker(self, member: str) -> str:
        """The member's open marker: exists until the job is completed (or FAILED)."""
        return f"{self.open}/{member}"

    def delayed_marker(self, member: str) -> str:
        """The member's delayed marker: exists while a retry delay may be running."""
        return f"{self.delayed}/{member}"


@dataclass(frozen=True, slots=True)
class QueuePaths:
    """A work queue's znodes (see the module docstring)."""

    queue: str
    name: str  # the encoded queue name
    node: str  # the head: seq, jobs, bytes
    buckets: str
    tally: str  # its held, done and failed tallies

    @classmethod
    def of(cls, queues_base: str, queue: str) -> QueuePaths:
        name = encode_job_id(queue)
        node = f"{queues_base}/{name}"
        return cls(queue, name, node, f"{node}/{BUCKETS_DIR}", f"{node}/{TALLY_DIR}")

    @property
    def heads(self) -> str:
        """The container of the rotated heads."""
        return f"{self.node}/{HEAD_DIR}"

    def head_node(self, rotation: int) -> str:
        """The znode holding the head after ``rotation`` rotations (0: the queue's own)."""
        return self.node if rotation == 0 else f"{self.heads}/{rotation:0{BUCKET_DIGITS}d}"

    def tallies(self) -> tuple[str, str, str]:
        """The held, done and failed tallies' parents (their numChildren are counts)."""
        return (f"{self.tally}/{HELD_DIR}", f"{self.tally}/{DONE_DIR}",
                f"{self.tally}/{FAILED_DIR}")

    def bucket(self, index: int) -> BucketPaths:
        node = f"{self.buckets}/{index:0{BUCKET_DIGITS}d}"
        return BucketPaths(index, node, f"{node}/{MEMBERS_DIR}", f"{node}/{OPEN_DIR}",
                           f"{node}/{HELD_DIR}", f"{node}/{DELAYED_DIR}", f"{node}/{FAILED_DIR}")


def bucket_of(seq: int) -> int:
    """The bucket of the job with ``seq`` (seqs start at 1)."""
    return (seq - 1) // BUCKET_JOBS


@dataclass(frozen=True, slots=True)
class QueueHead:
    """A queue's head (its node's data): the last seq issued, the jobs enqueued and not
    purged, their payload bytes."""

    seq: int = 0
    jobs: int = 0
    payload_bytes: int = 0

    @property
    def last_bucket(self) -> int:
        """The newest bucket (-1: none yet)."""
        return bucket_of(self.seq) if self.seq else -1

    def dump(self) -> bytes:
        fields = {"layout": LAYOUT, "seq": self.seq, "jobs": self.jobs, "bytes": self.payload_bytes}
        return json.dumps(fields, separators=(",", ":")).encode()

    @staticmethod
    def rotation(data: bytes | None, path: str, queue: str) -> int:
        """Where the head is, from the queue node's data: 0 (in it: layout 2) or the
        rotation ``r`` whose ``{qname}/h/{r}`` holds it (layout 3).

        Raises:
            LegacyQueueLayout: empty data: a queue of layout 1.
            CorruptData: anything else we did not write.
        """
        if not data:
            raise LegacyQueueLayout(path, queue)
        try:
            fields = json.loads(data)
            if fields["layout"] == LAYOUT:
                return 0
            rotation = fields["head"]
            if fields["layout"] != ROTATED_LAYOUT or type(rotation) is not int \
                    or rotation <= 0:
                raise ValueError(fields)
        except (ValueError, KeyError, TypeError):
            raise CorruptData(f"{path} holds data consensus_lease did not write") from None
        return rotation

    @staticmethod
    def dump_rotated(rotation: int) -> bytes:
        """The queue node's data once its head moved to ``{qname}/h/{rotation}``."""
        return json.dumps({"layout": ROTATED_LAYOUT, "head": rotation},
                          separators=(",", ":")).encode()

    @classmethod
    def parse(cls, data: bytes | None, path: str, queue: str) -> QueueHead:
        """The head, from the queue node's data.

        Raises:
            LegacyQueueLayout: empty data: a queue of layout 1.
            CorruptData: anything else we did not write.
        """
        if not data:
            raise LegacyQueueLayout(path, queue)
        try:
            fields = json.loads(data)
            if fields["layout"] != LAYOUT:
                raise ValueError(fields["layout"])
            head = cls(fields["seq"], fields["jobs"], fields["bytes"])
            if any(type(v) is not int or v < 0 for v in (head.seq, head.jobs, head.payload_bytes)):
                raise ValueError(head)
        except (ValueError, KeyError, TypeError):
            raise CorruptData(f"{path} holds data consensus_lease did not write") from None
        return head


def member_name(seq: int, job_id: str) -> str:
    return f"{seq:0{SEQ_DIGITS}d}-{encode_job_id(job_id)}"


def parse_member(member: str) -> tuple[int, str] | None:
    """``(seq, job_id)`` from a member znode's name, or ``None`` for a name we never make."""
    seq, dash, name = member.partition("-")
    if not dash or len(seq) != SEQ_DIGITS or not seq.isdigit():
        return None
    job_id = decode_name(name)
    if job_id is None or is_election_key(job_id):  # never enqueued: see enqueue
        return None
    return int(seq), job_id


@dataclass(frozen=True, slots=True)
class Tally:
    """A queued job's entries in its queue's tallies (see the module docstring)."""

    held: str  # EPHEMERAL, with the held marker
    done: str  # made by the completion
    failed: str  # with the failed marker


@dataclass(frozen=True, slots=True)
class QueueTag:
    """A queued job's tag (``{job}/queue``): its queue, its member name, and the nonce of
    the enqueue that made it (how a lost answer is read back)."""

    queue: str  # encoded, as QueuePaths.name
    member: str
    nonce: str
    bucket: int | None = None  # None: a job of a layout-1 queue (no buckets)

    def _path(self, queues_base: str, kind: str) -> str:
        if self.bucket is None:
            return f"{queues_base}/{self.queue}/{kind}/{self.member}"
        return (f"{queues_base}/{self.queue}/{BUCKETS_DIR}/"
                f"{self.bucket:0{BUCKET_DIGITS}d}/{kind}/{self.member}")

    def marker(self, queues_base: str) -> str:
        """The path of this job's open marker (deleted by its completion, or FAILED)."""
        return self._path(queues_base, OPEN_DIR)

    def delayed(self, queues_base: str) -> str:
        """The path of this job's delayed marker (a fail() with a retry delay makes it)."""
        return self._path(queues_base, DELAYED_DIR)

    def held(self, queues_base: str) -> str:
        """The path of this job's held marker (ephemeral, with the owner znode)."""
        return self._path(queues_base, HELD_DIR)

    def failed(self, queues_base: str) -> str | None:
        """The path of this job's failed marker (``None``: a layout-1 queue has none)."""
        return None if self.bucket is None else self._path(queues_base, FAILED_DIR)

    def tally(self, queues_base: str) -> Tally | None:
        """This job's tally entries (``None``: a layout-1 queue has none)."""
        if self.bucket is None:
            return None
        base = f"{queues_base}/{self.queue}/{TALLY_DIR}"
        return Tally(f"{base}/{HELD_DIR}/{self.member}", f"{base}/{DONE_DIR}/{self.member}",
                     f"{base}/{FAILED_DIR}/{self.member}")

    def dump(self) -> bytes:
        fields: dict[str, Any] = {"format": FORMAT, "queue": self.queue,
                                  "member": self.member, "nonce": self.nonce}
        if self.bucket is not None:
            fields["bucket"] = self.bucket
        return json.dumps(fields, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, data: bytes | None, path: str) -> QueueTag:
        try:
            fields = json.loads(data or b"")
            if fields["format"] != FORMAT:
                raise ValueError(fields["format"])
            bucket = fields.get("bucket")
            if bucket is not None and (type(bucket) is not int or bucket < 0):
                raise ValueError(bucket)
            tag = cls(str(fields["queue"]), str(fields["member"]), str(fields["nonce"]),
                      bucket)
        except (ValueError, KeyError, TypeError):
            raise CorruptData(f"{path} holds data consensus_lease did not write") from None
        if parse_member(tag.member) is None:
            raise CorruptData(f"{path} names a queue member we never make: {tag.member!r}")
        return tag


def new_nonce() -> str:
    return os.urandom(8).hex()  # as secrets.token_hex(8), with fewer calls


def token(epoch: int, version: int) -> int:
    """The fencing token of a job znode ``version`` claimed in store epoch ``epoch``."""
    return (epoch << EPOCH_SHIFT) | version


def split_token(generation: int) -> tuple[int, int]:
    """``(epoch, version)`` of a token (see :func:`token`)."""
    return generation >> EPOCH_SHIFT, generation & ((1 << EPOCH_SHIFT) - 1)


def dump_epoch(epoch: int, nonce: str) -> bytes:
    return f"{epoch} {nonce}".encode()


def parse_epoch(data: bytes | None, path: str) -> int:
    """The epoch ``{chroot}/epoch`` holds (empty: 0)."""
    text = (data or b"").split(maxsplit=1)
    try:
        epoch = int(text[0].decode("ascii")) if text else 0
    except (ValueError, UnicodeDecodeError):
        epoch = -1
    if not 0 <= epoch <= MAX_EPOCH:
        raise CorruptData(f"{path} holds data consensus_lease did not write: "
                          f"{(data or b'')[:80]!r}")
    return epoch


@dataclass(frozen=True, slots=True)
class JobData:
    """The job znode's data, decoded."""

    state: str  # "new" | "held" | "completed"
    owner: str | None = None
    session: str | None = None
    generation: int | None = None  # completed only: the generation that completed it
    nonce: str | None = None  # completed only: the completing request's nonce
    result: bytes | None = None
    attempt: int = 0  # the number of claims so far
    max_attempts: int | None = None  # from enqueue; None: unlimited
    epoch: int = 0  # the store epoch the last claim folded into its token

    @property
    def completed(self) -> bool:
        return self.state == "completed"

    def token(self, version: int) -> int:
        """The token of the claim that set the job znode to ``version`` or, once
        completed, of the claim that completed it."""
        local = self.generation if self.completed else None
        return token(self.epoch, version if local is None else local)


@dataclass(frozen=True, slots=True)
class OwnerData:
    """The owner znode's data, decoded.

    Attributes:
        owner / session: the holder's label and session id.
        nonce: the claim's nonce (how a lost claim answer is read back).
        value: what ``set_value`` wrote with this hold (``None``: nothing yet).
        value_nonce: the nonce of the ``set_value`` call that wrote it.
    """

    owner: str
    session: str
    nonce: str
    value: bytes | None = None
    value_nonce: str | None = None


_quote: Callable[[str], str] = json.encoder.encode_basestring_ascii
"""What ``json.dumps`` (``ensure_ascii``, the default) writes for a string."""


def _flat_json(fields: dict[str, Any], comma: str, colon: str) -> str:
    """``json.dumps(fields, separators=(comma, colon))``, byte for byte, for the flat
    headers this module writes (str and int values); anything else is left to
    ``json.dumps``. Written out here because every claim and completion writes one
    (json.dumps costs several times as much for so few fields)."""
    parts = []
    for key, value in fields.items():
        quoted = _KEYS.get(key)
        if quoted is None:
            quoted = _quote(key)
        kind = type(value)
        if kind is str:
            parts.append(f"{quoted}{colon}{_quote(value)}")
        elif kind is int:
            parts.append(f"{quoted}{colon}{int.__repr__(value)}")
        else:
            return json.dumps(fields, separators=(comma, colon))
    return "{" + comma.join(parts) + "}"


_KEYS = {key: _quote(key) for key in (
    "format", "state", "owner", "session", "nonce", "attempt", "generation", "max_attempts",
    "epoch",
)}
"""The header keys written on every claim and completion, quoted once."""


def _dump(header: dict[str, Any], payload: bytes = b"") -> bytes:
    head = _flat_json({"format": FORMAT, **header}, ",", ":").encode()
    return head + b"\n" + payload


def _limit(max_attempts: int | None, epoch: int = 0) -> dict[str, int]:
    """The optional fields: the limit unless ``None``, the epoch unless 0 (so that a
    store never bumped keeps the data it always had)."""
    limit = {} if max_attempts is None else {"max_attempts": max_attempts}
    return limit if epoch == 0 else {**limit, "epoch": epoch}


def dump_new(max_attempts: int | None) -> bytes:
    """A job znode as enqueue makes it: ``b""`` without a limit (as a job first claimed by
    name is made), else the limit."""
    return b"" if max_attempts is None else _dump({"state": "new", **_limit(max_attempts)})


@functools.lru_cache(maxsize=256)  # one session writes the same few again and again
def dump_claim(owner: str, session: str, attempt: int = 0,
               max_attempts: int | None = None, epoch: int = 0) -> bytes:
    header = {"state": "held", "owner": owner, "session": session, "attempt": attempt}
    return _dump({**header, **_limit(max_attempts, epoch)})


def dump_completed(
    owner: str, session: str, generation: int, nonce: str, result: bytes, attempt: int = 0,
    max_attempts: int | None = None, epoch: int = 0,
) -> bytes:
    """The completion record; ``generation`` is the job znode's version it completed at
    (the token's local part), ``epoch`` the claim's epoch."""
    if _plain(nonce):  # every completion writes one: the session's fields quoted once
        tail = f'{generation:d},"nonce":"{nonce}","attempt":{attempt:d}'
        if max_attempts is not None:
            tail += f',"max_attempts":{max_attempts:d}'
        if epoch != 0:
            tail += f',"epoch":{epoch:d}'
        return f"{_completed_head(owner, session)}{tail}}}\n".encode() + result
    header = {
        "state": "completed",
        "owner": owner,
        "session": session,
        "generation": generation,
        "nonce": nonce,
        "attempt": attempt,
    }
    return _dump({**header, **_limit(max_attempts, epoch)}, result)


def _plain(nonce: str) -> bool:
    """``nonce`` is written as it is inside JSON quotes (ASCII letters and digits, as
    :func:`new_nonce` makes)."""
    return nonce.isascii() and nonce.isalnum()


@functools.lru_cache(maxsize=256)  # one session completes jobs again and again
def _completed_head(owner: str, session: str) -> str:
    """A completion record's JSON up to the generation's value."""
    return _flat_json({"format": FORMAT, "state": "completed", "owner": owner,
                       "session": session}, ",", ":")[:-1] + ',"generation":'


@functools.lru_cache(maxsize=256)  # one session claims jobs again and again
def _owner_head(owner: str, session: str) -> str:
    """An owner znode's JSON (without a value) up to the nonce's value."""
    return _flat_json({"owner": owner, "session": session}, ", ", ": ")[:-1] + ', "nonce": "'


def dump_owner(
    owner: str, session: str, nonce: str, value: bytes | None = None,
    value_nonce: str = "",
) -> bytes:
    """The owner znode's data: the JSON fields alone without a value (as every claim
    writes it), else the fields with ``vnonce`` then a newline and the value."""
    if value is None and _plain(nonce):  # every claim writes one
        return f'{_owner_head(owner, session)}{nonce}"}}'.encode()
    fields = {"owner": owner, "session": session, "nonce": nonce}
    if value is None:
        return _flat_json(fields, ", ", ": ").encode()
    return json.dumps({**fields, "vnonce": value_nonce}).encode() + b"\n" + value


def _header(data: bytes, path: str) -> tuple[dict[str, Any], bytes]:
    head, newline, payload = data.partition(b"\n")
    try:
        header = json.loads(head)
    except ValueError:
        header = None
    if not newline or not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CorruptData(f"{path} holds data consensus_lease did not write: {data[:80]!r}")
    return header, payload


def _count(header: dict[str, Any], name: str, path: str, default: int | None) -> int | None:
    value = header.get(name, default)
    if value is not None and (type(value) is not int or value < 0):
        raise CorruptData(f"{path} holds a bad {name}: {value!r}")
    return value


def _required(header: dict[str, Any], name: str, path: str) -> int:
    value = _count(header, name, path, None)
    if value is None:
        raise CorruptData(f"{path} lacks {name}")
    return value


def parse_job(data: bytes | None, path: str) -> JobData:
    if not data:
        return JobData("new")
    header, payload = _header(data, path)
    state = header.get("state")
    attempt = _count(header, "attempt", path, 0) or 0
    limit = _count(header, "max_attempts", path, None)
    epoch = _count(header, "epoch", path, 0) or 0
    if state == "new":
        return JobData("new", max_attempts=limit)
    if state == "held":
        return JobData("held", owner=header.get("owner"), session=header.get("session"),
                       attempt=attempt, max_attempts=limit, epoch=epoch)
    if state == "completed" and isinstance(header.get("generation"), int):
        return JobData(
            "completed",
            owner=header.get("owner"),
            session=header.get("session"),
            generation=header["generation"],
            nonce=header.get("nonce"),
            result=payload,
            attempt=attempt,
            max_attempts=limit,
            epoch=epoch,
        )
    raise CorruptData(f"{path} holds an unknown job state {state!r}")


def delay_ms(retry_in_s: float) -> int:
    """A retry delay in whole ms (rounded up, as mtimes are whole ms)."""
    return math.ceil(retry_in_s * 1000)


@dataclass(frozen=True, slots=True)
class Failure:
    """The failure znode (``{job}/failure``), decoded, with its version and mtime.

    Attributes:
        failed: the job is FAILED (dead letter) until ``requeue``.
        generation: the job znode's version when it was written; a retry delay runs only
            while the job is still at that version (no claim since).
        base: attempts counted before the last requeue (the budget is
            ``attempt - base < max_attempts``).
        retry_in_s: the retry delay recorded (0: none), from ``mtime_ms`` on.
        error: the last recorded error, or ``None``.
        nonce: the writing request's nonce (how a lost answer is read back).
        version / mtime_ms: the znode's version and the leader's time of its last write.
    """

    failed: bool
    generation: int
    base: int
    retry_in_s: float
    error: str | None
    nonce: str
    version: int = 0
    mtime_ms: int = 0

    def delaying(self, version: int) -> bool:
        """Whether a retry delay was recorded and the job was not claimed since (the job
        znode is still at ``version`` == ``generation``); it may have passed already."""
        return not self.failed and self.retry_in_s > 0 and self.generation == version

    @property
    def not_before_ms(self) -> int:
        """End of the retry delay on the store's clock (ms since the epoch): claimable
        once a fresh write's mtime is past it (mtimes are whole ms: "past" = ``>``)."""
        return self.mtime_ms + delay_ms(self.retry_in_s)


def dump_failure(failure: Failure) -> bytes:
    header = {
        "failed": failure.failed, "generation": failure.generation, "base": failure.base,
        "retry_in_s": failure.retry_in_s, "nonce": failure.nonce,
        "has_error": failure.error is not None,
    }
    return _dump(header, (failure.error or "").encode())


def parse_failure(answer: tuple[bytes, Any] | None, path: str) -> Failure | None:
    """The failure znode from its ``(data, stat)`` (``None`` if absent)."""
    if answer is None:
        return None
    header, payload = _header(answer[0], path)
    try:
        retry = header["retry_in_s"]
        if type(retry) not in (int, float) or not math.isfinite(retry) or retry < 0:
            raise ValueError(retry)
        return Failure(
            header["failed"] is True, _required(header, "generation", path),
            _count(header, "base", path, 0) or 0, float(retry),
            payload.decode() if header["has_error"] else None, str(header["nonce"]),
            answer[1].version, answer[1].mtime,
        )
    except (KeyError, ValueError, TypeError):
        raise CorruptData(f"{path} holds data consensus_lease did not write") from None


def written_by(answer: tuple[bytes, Any] | None, path: str, nonce: str) -> bool:
    """Whether the failure znode ``(data, stat)`` was last written with ``nonce``."""
    failure = parse_failure(answer, path)
    return failure is not None and failure.nonce == nonce


def dump_delayed(retry_in_s: float) -> bytes:
    return json.dumps({"format": FORMAT, "retry_in_s": retry_in_s},
                      separators=(",", ":")).encode()


def parse_delayed(answer: tuple[bytes, Any], path: str) -> int:
    """When a delayed marker's delay ends (store clock, ms since the epoch), from its
    ``(data, stat)``: its mtime (the failing write's) + its delay."""
    try:
        fields = json.loads(answer[0] or b"")
        retry = float(fields["retry_in_s"])
        if fields["format"] != FORMAT or not math.isfinite(retry):
            raise ValueError(fields)
    except (ValueError, KeyError, TypeError):
        raise CorruptData(f"{path} holds data consensus_lease did not write") from None
    return int(answer[1].mtime) + delay_ms(retry)


def parse_owner(data: bytes | None, path: str) -> OwnerData:
    # json.dumps escapes newlines: the first one ends the fields.
    head, _, value = (data or b"").partition(b"\n")
    try:
        fields = json.loads(head)
        owner = OwnerData(str(fields["owner"]), str(fields["session"]), str(fields["nonce"]))
        if "vnonce" not in fields:
            return owner
        return OwnerData(owner.owner, owner.session, owner.nonce, value, str(fields["vnonce"]))
    except (ValueError, KeyError, TypeError):
        raise CorruptData(f"{path} holds data consensus_lease did not write") from None


def to_record(
    paths: JobPaths, job: tuple[bytes, Any] | None, owner: tuple[bytes, Any] | None,
    failure: tuple[bytes, Any] | None = None,
) -> LeaseRecord | None:
    """The record for a job from ``(data, stat)`` of its job znode, owner znode and
    failure znode (``None`` where absent), read in that order.

    ``generation`` is the token: the job znode's version (the completing one, once
    completed) with the epoch the claim recorded (see :func:`token`).
    ``lease_until`` is always ``None``: ZooKeeper does not expose when a session will
    expire (the leader alone tracks it, from the holder's last contact).
    ``owner`` of an AVAILABLE job is the last holder's label, also after a release:
    a release only deletes the owner znode (writing the job znode would bump the
    version, which is the generation). ``not_before`` is the end of a retry delay
    recorded since the last claim (failure znode mtime + delay, store clock), also once
    it has passed: telling would take a write (see ``clock``). ``value`` is the one
    ``set_value`` wrote with the current hold (HELD only).
    """
    if job is None:
        return None
    data, stat = job
    parsed = parse_job(data, paths.job)
    fail = parse_failure(failure, paths.failure)

    def record(
        label: str | None, generation: int, state: JobState, not_before: float | None = None,
        value: bytes | None = None,
    ) -> LeaseRecord:
        return LeaseRecord(
            paths.job_id, label, None, generation, state, parsed.result, parsed.attempt,
            None if fail is None else fail.error, not_before, parsed.max_attempts, value=value,
        )

    generation = parsed.token(stat.version)
    if parsed.completed:
        return record(parsed.owner, generation, JobState.COMPLETED)
    if owner is not None:
        holder = parse_owner(owner[0], paths.owner)
        return record(holder.owner, generation, JobState.HELD, value=holder.value)
    if fail is not None and fail.failed:
        return record(parsed.owner, generation, JobState.FAILED)
    delaying = fail is not None and fail.delaying(stat.version)
    not_before = fail.not_before_ms / 1000 if fail is not None and delaying else None
    return record(parsed.owner, generation, JobState.AVAILABLE, not_before)
