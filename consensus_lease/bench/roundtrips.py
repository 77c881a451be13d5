"""Counting store requests at the transport, the same way for our backend and the raw
client, so that requests per cycle can be compared like with like.

===========  ==================================================================  =======
client       what is counted                                                     unit
===========  ==================================================================  =======
gRPC (etcd)  every unary call and every message sent on a stream, by method      request
             (a client interceptor on each channel made by ``grpc.insecure_channel``
             / ``grpc.secure_channel`` while counting)
kazoo (ZK)   every request kazoo's connection writes to the socket, by request   request
             class (``ConnectionHandler._submit``), pings left out; a ``multi``
             is one ``Transaction``
sqlite3      every statement started on a connection made by                     statement
             ``sqlite3.connect`` while counting (``execute``; ``executemany``:
             one per row; ``executescript``: one per statement), by first
             word; trigger bodies (``set_trace_callback``) are counted apart
             as ``TRIGGER``
psycopg      every statement a ``psycopg.Cursor`` (and so ``Connection.execute``)  statement
(PostgreSQL) executes while counting, by first word (``WITH`` for a CTE;
             ``executemany``: one per row); on every connection of the process,
             also one made before the block
===========  ==================================================================  =======

:func:`counting` patches those entry points *in this process* for the duration of
a ``with`` block; clients must be created inside it (a channel or connection made before
is not seen). It is meant for a bench worker process that counts a few cycles on a
client of its own, then closes it: the interceptor and the trace callback cost CPU, so
the timed cycles never run on a counted client.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["TRANSPORTS", "RequestCount", "counting", "requests_total"]


class RequestCount:
    """Requests seen so far, by name (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_name: Counter[str] = Counter()
        self.transports: set[str] = set()

    def add(self, name: str) -> None:
        with self._lock:
            self._by_name[name] += 1

    def reset(self) -> None:
        with self._lock:
            self._by_name.clear()

    def snapshot(self) -> dict[str, int]:
        """Requests by name since the last :meth:`reset`."""
        with self._lock:
            return dict(self._by_name)


def _grpc_interceptor(count: RequestCount) -> Any:
    import grpc

    def short(details: Any) -> str:
        return str(details.method).rsplit("/", 1)[-1]

    def counted(details: Any, requests: Iterator[Any]) -> Iterator[Any]:
        for request in requests:
            count.add(short(details))
            yield request

    # grpc ships no type hints: its interceptor bases are Any to mypy.
    class Interceptor(grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
                      grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
                      grpc.StreamUnaryClientInterceptor,  # type: ignore[misc]
                      grpc.StreamStreamClientInterceptor):  # type: ignore[misc]
        def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            count.add(short(details))
            return continuation(details, request)

        def intercept_unary_stream(self, continuation: Any, details: Any,
                                   request: Any) -> Any:
            count.add(short(details))
            return continuation(details, request)

        def intercept_stream_unary(self, continuation: Any, details: Any,
                                   requests: Any) -> Any:
            return continuation(details, counted(details, requests))

        def intercept_stream_stream(self, continuation: Any, details: Any,
                                    requests: Any) -> Any:
            return continuation(details, counted(details, requests))

    return Interceptor()


@contextlib.contextmanager
def _patched(owner: Any, name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def _patch_grpc(stack: contextlib.ExitStack, count: RequestCount) -> None:
    try:
        import grpc
    except ImportError:
        return
    interceptor = _grpc_interceptor(count)

    def wrap(make_channel: Callable[..., Any]) -> Callable[..., Any]:
        def counted_channel(*args: Any, **kwargs: Any) -> Any:
            return grpc.intercept_channel(make_channel(*args, **kwargs), interceptor)

        return counted_channel

    stack.enter_context(_patched(grpc, "insecure_channel", wrap))
    stack.enter_context(_patched(grpc, "secure_channel", wrap))
    count.transports.add("grpc")


def _patch_kazoo(stack: contextlib.ExitStack, count: RequestCount) -> None:
    try:  # kazoo's internals are the ZooKeeper driver's to name (its _transport_kazoo module)
        from ..backends.zookeeper._transport_kazoo import count_requests
    except ImportError:
        return
    stack.enter_context(count_requests(count.add))
    count.transports.add("kazoo")


def _patch_sqlite(stack: contextlib.ExitStack, count: RequestCount) -> None:
    import sqlite3

    # SQLite's trace callback also fires when a statement with RETURNING runs a trigger
    # program (once more per row, with the statement's own text): a statement is
    # counted when it is started (execute / executemany, one per row / executescript,
    # one per statement traced), the callback counting only trigger bodies and scripts.
    scripts = threading.local()

    def add(statement: str) -> None:
        text = statement.lstrip()
        count.add(text.split(None, 1)[0].upper() if text else "?")

    def trace(statement: str) -> None:
        if statement.lstrip().startswith("--"):  # a trigger's body: "-- TRIGGER name"
            count.add("TRIGGER")
        elif getattr(scripts, "active", False):
            add(statement)

    class CountedCursor(sqlite3.Cursor):
        def execute(self, sql: str, *args: Any) -> Any:
            add(sql)
            return super().execute(sql, *args)

        def executemany(self, sql: str, rows: Iterable[Any]) -> Any:
            rows = list(rows)
            for _ in rows:
                add(sql)
            return super().executemany(sql, rows)

        def executescript(self, script: str) -> Any:
            scripts.active = True
            try:
                return super().executescript(script)
            finally:
                scripts.active = False

    class CountedConnection(sqlite3.Connection):
        def cursor(self, factory: Any = CountedCursor) -> Any:
            return super().cursor(factory)

        def execute(self, sql: str, *args: Any) -> Any:
            return self.cursor().execute(sql, *args)

        def executemany(self, sql: str, rows: Iterable[Any]) -> Any:
            return self.cursor().executemany(sql, rows)

        def executescript(self, script: str) -> Any:
            return self.cursor().executescript(script)

    def wrap(connect: Callable[..., Any]) -> Callable[..., Any]:
        def counted_connect(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("factory", CountedConnection)
            connection = connect(*args, **kwargs)
            connection.set_trace_callback(trace)
            return connection

        return counted_connect

    stack.enter_context(_patched(sqlite3, "connect", wrap))
    count.transports.add("sqlite3")


def _first_word(query: Any, cursor: Any) -> str:
    if isinstance(query, bytes):
        query = query.decode("utf-8", "replace")
    elif not isinstance(query, str):  # psycopg.sql.Composable
        try:
            query = query.as_string(cursor)
        except Exception:  # a count must never break the statement
            return type(query).__name__
    text = query.lstrip()
    return text.split(None, 1)[0].upper() if text else "?"


def _patch_psycopg(stack: contextlib.ExitStack, count: RequestCount) -> None:
    try:
        import psycopg
    except ImportError:
        return

    def wrap_execute(execute: Callable[..., Any]) -> Callable[..., Any]:
        def counted_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            count.add(_first_word(query, self))
            return execute(self, query, *args, **kwargs)

        return counted_execute

    def wrap_executemany(executemany: Callable[..., Any]) -> Callable[..., Any]:
        def counted_executemany(self: Any, query: Any, params_seq: Iterable[Any],
                                *args: Any, **kwargs: Any) -> Any:
            rows = list(params_seq)
            name = _first_word(query, self)
            for _ in rows:
                count.add(name)
            return executemany(self, query, rows, *args, **kwargs)

        return counted_executemany

    stack.enter_context(_patched(psycopg.Cursor, "execute", wrap_execute))
    stack.enter_context(_patched(psycopg.Cursor, "executemany", wrap_executemany))
    count.transports.add("psycopg")


TRANSPORTS = {"etcd": "grpc", "zookeeper": "kazoo", "sqlite": "sqlite3",
              "postgresql": "psycopg"}
"""The transport each backend's requests go through."""

_PATCHES = {"grpc": _patch_grpc, "kazoo": _patch_kazoo, "sqlite3": _patch_sqlite,
            "psycopg": _patch_psycopg}


@contextlib.contextmanager
def counting(transports: Iterable[str] = tuple(_PATCHES)) -> Iterator[RequestCount]:
    """Count the requests of every client of ``transports`` (``grpc``, ``kazoo``,
    ``sqlite3``, ``psycopg``; default all) created inside the block (see the module docstring); the
    patches are removed on exit. A transport whose library is not installed is left out
    of ``RequestCount.transports``.

    Raises:
        ValueError: an unknown transport name.
    """
    chosen = tuple(transports)
    unknown = set(chosen) - set(_PATCHES)
    if unknown:
        raise ValueError(f"unknown transports {sorted(unknown)}; known: {sorted(_PATCHES)}")
    count = RequestCount()
    with contextlib.ExitStack() as stack:
        for name in chosen:
            _PATCHES[name](stack, count)
        yield count


def requests_total(by_name: dict[str, int]) -> int:
    """Round trips in a snapshot: every name but SQLite's trigger bodies (they run
    inside the statement that fired them)."""
    return sum(n for name, n in by_name.items() if name != "TRIGGER")
