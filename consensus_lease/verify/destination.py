"""Where the verifier's workers write their effects: a fenced destination.

``open_destination(spec)``: a filesystem path is the library's own
:class:`~consensus_lease.fencing.SqliteFence`; a SQLAlchemy URL (``postgresql+psycopg://...``,
``sqlite:////abs/path.db``) is :class:`~consensus_lease.fencing_sql.SqlFence` with tables
``cl_verify_tokens`` / ``cl_verify_effects`` (runs share them; each run's job ids are
unique, so the checker reads only its own).
"""

from __future__ import annotations

from typing import Protocol

from ..fencing import Effect, FenceOutcome, SqliteFence

__all__ = ["SQL_TABLE_PREFIX", "Destination", "job_effects", "open_destination"]

SQL_TABLE_PREFIX = "cl_verify_"


class Destination(Protocol):
    """A fenced destination as the verifier uses it."""

    def apply(
        self, resource: str, token: int, effect_id: str, payload: bytes = b""
    ) -> FenceOutcome:
        """Apply an effect iff ``token`` >= the highest accepted for ``resource``
        (unless the destination was opened unfenced).

        Raises:
            FenceRejected: a higher token was accepted; nothing applied.
            BackendUnavailable: nothing applied.
        """
        ...

    def highest_token(self, resource: str) -> int | None:
        """The highest token accepted for ``resource``, or ``None``."""
        ...

    def effects(self, resource: str | None = None) -> list[Effect]:
        """Accepted effects ordered by ``seq``."""
        ...

    def close(self) -> None: ...


class _SqlDestination:
    """A :class:`~consensus_lease.fencing_sql.SqlFence`, each effect in its own transaction."""

    def __init__(self, url: str, *, enforce_tokens: bool, create_tables: bool) -> None:
        from ..fencing_sql import SqlFence  # SQLAlchemy only when a URL is used

        self.fence = SqlFence(url, table_prefix=SQL_TABLE_PREFIX, enforce_tokens=enforce_tokens,
                              create_tables=create_tables)

    def apply(
        self, resource: str, token: int, effect_id: str, payload: bytes = b""
    ) -> FenceOutcome:
        return self.fence.apply_now(resource, token, effect_id, payload)

    def highest_token(self, resource: str) -> int | None:
        return self.fence.highest_token(resource)

    def effects(self, resource: str | None = None) -> list[Effect]:
        return self.fence.effects(resource)

    def close(self) -> None:
        self.fence.close()


def open_destination(spec: str, *, enforce_tokens: bool = True,
                     create_tables: bool = True) -> Destination:
    """Open the destination named by ``spec`` (a file path or a SQLAlchemy URL).

    Args:
        spec: ``/path/to/destination.db`` (SqliteFence) or a SQLAlchemy URL (SqlFence).
        enforce_tokens: ``False`` = unfenced (the control experiment).
        create_tables: SQL only: create the tables if missing (the verifier does it
            once before starting workers).

    Raises:
        BackendUnavailable: cannot be opened. InvalidArgument: bad URL.
    """
    if "://" in spec:
        return _SqlDestination(spec, enforce_tokens=enforce_tokens, create_tables=create_tables)
    return SqliteFence(spec, enforce_tokens=enforce_tokens)


def job_effects(destination: Destination, jobs: list[str]) -> list[Effect]:
    """The accepted effects of ``jobs`` only, ordered by ``seq``."""
    found = [e for job in jobs for e in destination.effects(job)]
    return sorted(found, key=lambda e: e.seq)
