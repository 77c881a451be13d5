"""Fork safety: a store, its sessions and their leases belong to the process that opened
them.

A child made by ``fork()`` (multiprocessing's ``fork`` start method, Celery's prefork
pool, gunicorn ``--preload``, PyTorch DataLoader workers) inherits copies of them: the
parent's etcd lease id, ZooKeeper session and SQLite session rows, and client objects
(gRPC channels, kazoo clients, a ``sqlite3`` connection) whose threads did not survive
the fork. Whatever the child did with them would act for the parent: a claim would be
made under the parent's session, a ``close()`` would revoke the parent's etcd lease,
close its ZooKeeper session (kazoo's ``stop()`` sends closeSession down the inherited
socket) or delete its SQLite session row, and the parent's jobs would be up for grabs
while it works on them.

So each of these objects records its :class:`Origin`; in any other process every use
raises :class:`~consensus_lease.errors.StoreInherited` before anything is sent, and
``close()`` only forgets: no store request, no thread to stop (none was inherited), and
no call into the inherited client objects — they are kept referenced (:func:`abandon`)
so that not even their finalizers run in the child while it lives. SQLite says not to
close an inherited connection in the child (https://www.sqlite.org/howtocorrupt.html,
"Carrying an open database connection across a fork()"); gRPC's fork support does not
extend to using channels made before the fork
(https://github.com/grpc/grpc/blob/master/doc/fork_support.md).
"""

from __future__ import annotations

import os

from .errors import StoreInherited

__all__ = ["Origin", "abandon"]

_forks = 0
"""How many forks this process is away from the interpreter's first process, counted by
the ``after_in_child`` hook, which CPython runs in the child of ``os.fork``,
``os.forkpty``, multiprocessing's ``fork`` start method and ``subprocess`` with
``preexec_fn``. It tells a child from its parent where the pid cannot (a fork into a new
pid namespace can reuse the parent's pid). A fork that bypasses the hook (``fork()``
called through ctypes or cffi, or by a C extension that skips
``PyOS_AfterFork_Child``) leaves it unchanged: the pid catches that one."""

_abandoned: list[object] = []
"""Inherited drivers, kept until the process exits (no lock: a lock held by a thread
of the parent at the fork would stay locked in the child; ``append`` is atomic)."""


def _after_fork_in_child() -> None:
    global _forks
    _forks += 1


if hasattr(os, "register_at_fork"):  # POSIX; there is no fork() elsewhere
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Origin:
    """The process an object was made in: its pid and the fork count (see ``_forks``);
    checking costs one ``getpid()``."""

    __slots__ = ("forks", "pid")

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.forks = _forks

    def inherited(self) -> bool:
        """Whether this is not the process that made the object (a fork's child)."""
        return self.forks != _forks or self.pid != os.getpid()

    def check(self, what: str) -> None:
        """Raise ``StoreInherited`` if this is a fork's child.

        Args:
            what: the object, for the message (``"LeaseStore"``, ``"session 0x..."``).
        """
        if self.inherited():
            raise StoreInherited(
                f"this {what} was opened by process {self.pid} and inherited by process "
                f"{os.getpid()} through fork(); it cannot be used here (its sessions are "
                f"the parent's). Open a store in this process, e.g. in the worker's start-up "
                f"hook; closing the inherited one is allowed and leaves the parent's "
                f"sessions alone"
            )


def abandon(resource: object) -> None:
    """Keep ``resource`` (an inherited driver) referenced until this process exits, so
    that nothing in it is finalised here: see the module docstring."""
    _abandoned.append(resource)
