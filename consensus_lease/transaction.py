"""The open block of :meth:`Lease.transaction <consensus_lease.Lease.transaction>`, and
its once-per-job effect records.

``with lease.transaction(conn) as tx:`` yields a :class:`LeaseTransaction`. Guard each
effect with ``tx.once(effect_id)``::

    with lease.transaction(conn) as tx:
        if tx.once("charge"):           # False: a generation of this job already did it
            conn.execute("INSERT INTO charges VALUES (%s, %s)", (job_id, amount))

What is guaranteed, and by what:

* **Per generation** (the store's row lock, :mod:`consensus_lease.backends.postgresql`;
  SQLite's write lock, :mod:`consensus_lease.backends.sqlite._transport_txn`): the block
  commits only if this session held the job at this generation when the transaction began (on
  the store's clock), and before any later generation's claim of the job — also when
  the holder was paused past its TTL inside the block.
* **Per job** (a unique key ``(job_id, effect_id)`` in the store's ``cl_effects``
  table, written in *your* transaction): among all the committed transactions of all
  generations of the job, ``once(effect_id)`` returned ``True`` in exactly one — or in
  none, if none committed. A rolled-back block leaves no record, so the next
  generation gets ``True`` and does the effect. So an effect written only when ``once``
  returns ``True``, in the same transaction, is committed at most once per job, and
  exactly once if any holder's block committed. The records last as long as the job's
  row: ``purge`` of a COMPLETED job deletes them with it.

Without ``once`` the block is once per *generation*: a holder paused inside it that
resumes commits its effect, and the next generation (claimed after that commit) runs
the job again and would write it a second time.
"""

from __future__ import annotations

from .backend import OnceCheck
from .errors import InvalidArgument
from .fencing import MAX_EFFECT_ID_CHARS

__all__ = ["MAX_EFFECT_ID_CHARS", "LeaseTransaction"]
# MAX_EFFECT_ID_CHARS (256) is the fences' limit: one effect id fits both a fence and
# tx.once (it was 200 here, under the same name)


class LeaseTransaction:
    """The open transaction of one ``with lease.transaction(conn) as tx:`` block.

    Attributes:
        job_id (str): the lease's job.
        generation (int): the lease's fencing token, held for the whole block.
        conn: the caller's connection the transaction runs on (``psycopg.Connection``
            or ``sqlite3.Connection``).
    """

    __slots__ = ("_check", "_open", "conn", "generation", "job_id")

    def __init__(self, job_id: str, generation: int, conn: object, check: OnceCheck) -> None:
        self.job_id = job_id
        self.generation = generation
        self.conn = conn
        self._check = check
        self._open = True

    def once(self, effect_id: str) -> bool:
        """Record ``effect_id`` for this job in this transaction; ``True`` iff it is new.

        ``True``: no committed transaction of any generation of this job recorded
        ``effect_id``, nor did this one: do the effect now, in this transaction.
        ``False``: it was recorded (committed by an earlier holder, or earlier in this
        block): skip the effect. The record commits or rolls back with the transaction,
        so exactly one committed transaction per ``(job_id, effect_id)`` ever saw
        ``True`` (module docstring). One statement (a round trip on PostgreSQL).

        Args:
            effect_id: names the effect within the job (non-empty ``str``, at most
                :data:`MAX_EFFECT_ID_CHARS` characters, no NUL), e.g. ``"charge"``.

        Returns:
            ``True`` the first time for this job, ``False`` after.

        Raises:
            InvalidArgument: a bad ``effect_id``, or the block has ended; nothing
                recorded, the transaction (if open) and the lease are unchanged.
            BackendUnavailable: the database failed the statement; the transaction is
                unusable (let the error end the block: it rolls back); the lease is
                still held until its deadline.
        """
        if not isinstance(effect_id, str) or not effect_id or "\x00" in effect_id \
                or len(effect_id) > MAX_EFFECT_ID_CHARS or not _encodable(effect_id):
            raise InvalidArgument(
                f"effect_id must be a non-empty str of at most {MAX_EFFECT_ID_CHARS} "
                f"characters without NUL or lone surrogates, not {effect_id!r:.60}",
                job_id=self.job_id,
                generation=self.generation,
            )
        if not self._open:
            raise InvalidArgument(
                f"tx.once({effect_id!r}): the lease.transaction() block of "
                f"{self.job_id!r} has ended; call it inside the block", job_id=self.job_id,
                generation=self.generation,
            )
        return self._check(effect_id)

    def _end(self) -> None:
        self._open = False

    def __repr__(self) -> str:
        state = "open" if self._open else "ended"
        return (f"LeaseTransaction(job_id={self.job_id!r}, generation={self.generation}, "
                f"{state})")


def end_transaction(tx: LeaseTransaction) -> None:
    """For the session's holdings (:mod:`consensus_lease._holdings`) only: ``tx``'s
    block has ended; its :meth:`~LeaseTransaction.once` refuses from now on."""
    tx._end()


def _encodable(text: str) -> bool:
    """Whether ``text`` is valid UTF-8 once encoded (no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
