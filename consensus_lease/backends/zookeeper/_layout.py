"""Where a job lives in ZooKeeper and what its znodes hold.

::

    {chroot}/jobs                       persistent container
    {chroot}/jobs/{name}                persistent job znode, one per job, never deleted
        version   = the generation (fencing token): +1 per claim; completion adds 1 more
        data      = b""                            never claimed (version 0)
                    {"format":1,"state":"held",...}\\n     last claim's owner and session
                    {"format":1,"state":"completed","generation":g,...}\\n<result bytes>
    {chroot}/jobs/{name}/owner          EPHEMERAL, exists while a live session holds the job
        ephemeralOwner = the holder's session id
        data      = {"owner":..., "session":..., "nonce":...}  (nonce: one per claim)
    {chroot}/jobs/{name}/queue          persistent, queued jobs only (made by enqueue)
        data      = {"format":1,"queue":{qname},"member":{member},"nonce":...}

Work queues (``qname``: the queue name, encoded as job ids are)::

    {chroot}/queues                     persistent container
    {chroot}/queues/{qname}             persistent, data b""
        version   = the last ``seq`` issued in this queue: each enqueue bumps it
    {chroot}/queues/{qname}/jobs/{member}   persistent, one per job enqueued (until purged)
        data      = the payload
    {chroot}/queues/{qname}/open/{member}   persistent, empty; deleted by the completion
                                        multi, so its children are the jobs not completed
    {chroot}/queues/{qname}/held/{member}   EPHEMERAL, empty, made by the claim multi with
                                        the owner znode, by the same session; deleted with
                                        it (release, completion multis; session end)

``member`` is ``{seq:010d}-{name}``: sorting names sorts by ``seq`` (FIFO). The claimable
jobs of a queue are the children of ``open`` less those of ``held``: two listings.

``name`` is the job id percent-encoded from UTF-8 with every byte outside
``[A-Za-z0-9_~-]`` escaped (``.`` too), so ``/``, ``.``, ``..``, spaces, control or
non-ASCII characters can neither collide nor leave ``{chroot}/jobs``; decoding is exact.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from ...errors import BackendUnavailable
from ...record import JobState, LeaseRecord

__all__ = [
    "FORMAT",
    "JobData",
    "JobPaths",
    "OwnerData",
    "QueuePaths",
    "QueueTag",
    "decode_name",
    "dump_claim",
    "dump_completed",
    "dump_owner",
    "encode_job_id",
    "member_name",
    "new_nonce",
    "parse_job",
    "parse_member",
    "parse_owner",
    "to_record",
]

FORMAT = 1
OWNER_NODE = "owner"
TAG_NODE = "queue"
MEMBERS_DIR, OPEN_DIR, HELD_DIR = "jobs", "open", "held"
SEQ_DIGITS = 10
"""A znode version is a signed 32-bit int: at most 2**31 - 1, ten digits."""


class CorruptData(BackendUnavailable):
    """A znode in our namespace holds data consensus_lease did not write."""


def encode_job_id(job_id: str) -> str:
    """The znode name for ``job_id`` (valid ids only: see ``check_job_id``)."""
    return quote(job_id, safe="").replace(".", "%2E")


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

    @classmethod
    def of(cls, base: str, job_id: str) -> JobPaths:
        job = f"{base}/{encode_job_id(job_id)}"
        return cls(job_id, job, f"{job}/{OWNER_NODE}", f"{job}/{TAG_NODE}")


@dataclass(frozen=True, slots=True)
class QueuePaths:
    """A work queue's znodes (see the module docstring)."""

    queue: str
    name: str  # the encoded queue name
    node: str  # its version counts the seqs issued
    members: str
    open: str
    held: str

    @classmethod
    def of(cls, queues_base: str, queue: str) -> QueuePaths:
        name = encode_job_id(queue)
        node = f"{queues_base}/{name}"
        return cls(queue, name, node, f"{node}/{MEMBERS_DIR}", f"{node}/{OPEN_DIR}",
                   f"{node}/{HELD_DIR}")

    def member(self, member: str) -> str:
        return f"{self.members}/{member}"

    def marker(self, member: str) -> str:
        """The member's open marker: exists until the job is completed."""
        return f"{self.open}/{member}"


def member_name(seq: int, job_id: str) -> str:
    return f"{seq:0{SEQ_DIGITS}d}-{encode_job_id(job_id)}"


def parse_member(member: str) -> tuple[int, str] | None:
    """``(seq, job_id)`` from a member znode's name, or ``None`` for a name we never make."""
    seq, dash, name = member.partition("-")
    if not dash or len(seq) != SEQ_DIGITS or not seq.isdigit():
        return None
    job_id = decode_name(name)
    return None if job_id is None else (int(seq), job_id)


@dataclass(frozen=True, slots=True)
class QueueTag:
    """A queued job's tag (``{job}/queue``): its queue, its member name, and the nonce of
    the enqueue that made it (how a lost answer is read back)."""

    queue: str  # encoded, as QueuePaths.name
    member: str
    nonce: str

    def marker(self, queues_base: str) -> str:
        """The path of this job's open marker (deleted by its completion)."""
        return f"{queues_base}/{self.queue}/{OPEN_DIR}/{self.member}"

    def held(self, queues_base: str) -> str:
        """The path of this job's held marker (ephemeral, with the owner znode)."""
        return f"{queues_base}/{self.queue}/{HELD_DIR}/{self.member}"

    def dump(self) -> bytes:
        fields = {"format": FORMAT, "queue": self.queue, "member": self.member,
                  "nonce": self.nonce}
        return json.dumps(fields, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, data: bytes | None, path: str) -> QueueTag:
        try:
            fields = json.loads(data or b"")
            if fields["format"] != FORMAT:
                raise ValueError(fields["format"])
            tag = cls(str(fields["queue"]), str(fields["member"]), str(fields["nonce"]))
        except (ValueError, KeyError, TypeError):
            raise CorruptData(f"{path} holds data consensus_lease did not write") from None
        if parse_member(tag.member) is None:
            raise CorruptData(f"{path} names a queue member we never make: {tag.member!r}")
        return tag


def new_nonce() -> str:
    return secrets.token_hex(8)


@dataclass(frozen=True, slots=True)
class JobData:
    """The job znode's data, decoded."""

    state: str  # "new" | "held" | "completed"
    owner: str | None = None
    session: str | None = None
    generation: int | None = None  # completed only: the generation that completed it
    nonce: str | None = None  # completed only: the completing request's nonce
    result: bytes | None = None

    @property
    def completed(self) -> bool:
        return self.state == "completed"


@dataclass(frozen=True, slots=True)
class OwnerData:
    owner: str
    session: str
    nonce: str


def _dump(header: dict[str, Any], payload: bytes = b"") -> bytes:
    head = json.dumps({"format": FORMAT, **header}, separators=(",", ":")).encode()
    return head + b"\n" + payload


def dump_claim(owner: str, session: str) -> bytes:
    return _dump({"state": "held", "owner": owner, "session": session})


def dump_completed(owner: str, session: str, generation: int, nonce: str, result: bytes) -> bytes:
    header = {
        "state": "completed",
        "owner": owner,
        "session": session,
        "generation": generation,
        "nonce": nonce,
    }
    return _dump(header, result)


def dump_owner(owner: str, session: str, nonce: str) -> bytes:
    return json.dumps({"owner": owner, "session": session, "nonce": nonce}).encode()


def _header(data: bytes, path: str) -> tuple[dict[str, Any], bytes]:
    head, newline, payload = data.partition(b"\n")
    try:
        header = json.loads(head)
    except ValueError:
        header = None
    if not newline or not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CorruptData(f"{path} holds data consensus_lease did not write: {data[:80]!r}")
    return header, payload


def parse_job(data: bytes | None, path: str) -> JobData:
    if not data:
        return JobData("new")
    header, payload = _header(data, path)
    state = header.get("state")
    if state == "held":
        return JobData("held", owner=header.get("owner"), session=header.get("session"))
    if state == "completed" and isinstance(header.get("generation"), int):
        return JobData(
            "completed",
            owner=header.get("owner"),
            session=header.get("session"),
            generation=header["generation"],
            nonce=header.get("nonce"),
            result=payload,
        )
    raise CorruptData(f"{path} holds an unknown job state {state!r}")


def parse_owner(data: bytes | None, path: str) -> OwnerData:
    try:
        fields = json.loads(data or b"")
        return OwnerData(str(fields["owner"]), str(fields["session"]), str(fields["nonce"]))
    except (ValueError, KeyError, TypeError):
        raise CorruptData(f"{path} holds data consensus_lease did not write") from None


def to_record(
    paths: JobPaths, job: tuple[bytes, Any] | None, owner: tuple[bytes, Any] | None
) -> LeaseRecord | None:
    """The record for a job from ``(data, stat)`` of its job znode and owner znode
    (``None`` where absent), read in that order.

    ``lease_until`` is always ``None``: ZooKeeper does not expose when a session will
    expire (the leader alone tracks it, from the holder's last contact).
    ``owner`` of an AVAILABLE job is the last holder's label, also after a release:
    a release only deletes the owner znode (writing the job znode would bump the
    version, which is the generation).
    """
    if job is None:
        return None
    data, stat = job
    parsed = parse_job(data, paths.job)
    if parsed.completed:
        return LeaseRecord(
            paths.job_id, parsed.owner, None, parsed.generation or 0, JobState.COMPLETED,
            parsed.result,
        )
    if owner is not None:
        holder = parse_owner(owner[0], paths.owner)
        return LeaseRecord(paths.job_id, holder.owner, None, stat.version, JobState.HELD)
    return LeaseRecord(paths.job_id, parsed.owner, None, stat.version, JobState.AVAILABLE)
