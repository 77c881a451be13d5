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
    "decode_name",
    "dump_claim",
    "dump_completed",
    "dump_owner",
    "encode_job_id",
    "new_nonce",
    "parse_job",
    "parse_owner",
    "to_record",
]

FORMAT = 1
OWNER_NODE = "owner"


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

    @classmethod
    def of(cls, base: str, job_id: str) -> JobPaths:
        job = f"{base}/{encode_job_id(job_id)}"
        return cls(job_id, job, f"{job}/{OWNER_NODE}")


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
