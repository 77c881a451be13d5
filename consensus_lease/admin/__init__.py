"""Operator subcommands: ``inspect``, ``enqueue``, ``requeue``, ``bump-epoch`` and
``upgrade-queue`` (one module each, registered through
``consensus_lease.cli.EXTRA_COMMANDS``).

Results go to stdout, messages and errors to stderr (one line each, never a traceback).
Exit status, the same for each::

    0   done
    1   some of the jobs named were refused, each reported on stderr (requeue: the job
        is not FAILED, or unknown; enqueue: the id exists outside this queue); the others
        were done
    2   usage error or bad input (option, URL, job id, payload, payload file, a
        ``bump-epoch --above`` past the store's token range, a store without an
        epoch, an ``upgrade-queue`` the store does not need or cannot do in place):
        nothing was changed
    69  the store could not be reached, refused service, or could not tell whether a
        request was applied (OutcomeUnknown); jobs reported before the error were done

(``consensus-lease run`` has codes of its own, from sysexits: it passes on its command's
status, which is often a small number like these.)

Commands that read or repair an existing store (``inspect``, ``requeue``,
``upgrade-queue``) open it with :func:`open_existing_store`: a SQLite URL naming a
missing file (a typo) is refused (exit 2) instead of creating an empty store there.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import TextIO

from ..errors import (
    BackendUnavailable,
    InvalidArgument,
    LeaseError,
    UnsupportedOperation,
)
from ..options import query_options
from ..store import LeaseStore, open_store
from ..validation import check_job_id

__all__ = [
    "EXIT_CODES_HELP", "EXIT_OK", "EXIT_REFUSED", "EXIT_UNAVAILABLE", "EXIT_USAGE",
    "guarded", "job_ids", "open_existing_store", "say", "shared",
]

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 69

EXIT_CODES_HELP = """\
exit status: 0 done; 1 some jobs refused (each reported); 2 usage error or bad input,
nothing changed; 69 store unreachable or outcome unknown"""


def say(message: str) -> None:
    """Print one message line to stderr."""
    print(f"consensus-lease: {message}", file=sys.stderr, flush=True)


def guarded(action: Callable[[], int]) -> int:
    """Run ``action``; turn typed errors into a one-line message and an exit status."""
    try:
        return action()
    except (InvalidArgument, UnsupportedOperation) as exc:
        say(f"error: {type(exc).__name__}: {exc}")
        return EXIT_USAGE
    except BackendUnavailable as exc:
        say(f"error: {type(exc).__name__}: {exc}")
        return EXIT_UNAVAILABLE
    except LeaseError as exc:
        say(f"error: {type(exc).__name__}: {exc}")
        return EXIT_UNAVAILABLE
    except OSError as exc:  # a payload file or stdin that cannot be read
        say(f"error: {exc}")
        return EXIT_USAGE


def job_ids(named: Iterable[str], stdin: TextIO | None = None) -> list[str]:
    """The job ids named on the command line; ``-`` stands for the ids read from
    ``stdin`` (default ``sys.stdin``), one per line (line ends stripped, empty lines
    skipped).

    Raises:
        InvalidArgument: an id is not a valid job id, or none was given.
    """
    ids: list[str] = []
    for name in named:
        if name != "-":
            ids.append(name)
            continue
        for line in stdin or sys.stdin:
            job = line.rstrip("\r\n")
            if job:
                ids.append(job)
    if not ids:
        raise InvalidArgument("no job ids given")
    return [check_job_id(job) for job in ids]


def open_existing_store(url: str) -> LeaseStore:
    """:func:`~consensus_lease.open_store` for commands that need a store to exist: on
    SQLite and PostgreSQL with ``create=false`` unless the URL's query string sets
    ``create`` (etcd's and ZooKeeper's stores exist with their cluster).

    Raises:
        InvalidArgument: the SQLite file (the PostgreSQL schema) does not exist, or holds
            no store.
        UnsupportedBackend / BackendUnavailable / ...: as ``open_store``.
    """
    scheme = url.split("://", 1)[0].lower() if isinstance(url, str) and "://" in url else ""
    if scheme in ("sqlite", "postgresql") and "create" not in query_options(url):
        return shared(open_store(url, create=False))
    return shared(open_store(url))


def shared(store: LeaseStore) -> LeaseStore:
    """``store``, if other processes can open the same data; closed and refused
    otherwise. A command runs in its own process: with ``memory://`` it would work on an
    empty store of its own, shared with nobody and gone when it ends.

    Raises:
        InvalidArgument: an in-process store (``capabilities.cross_process`` is False).
    """
    if not store.capabilities.cross_process:
        store.close()
        raise InvalidArgument(
            f"the {store.backend.scheme} store lives inside one process; a command cannot "
            f"share it (use sqlite:////path/to/file.db, etcd://, zk:// or postgresql://)"
        )
    return store
