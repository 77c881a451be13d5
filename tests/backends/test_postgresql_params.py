"""Hostile connection parameters: a value libpq cannot carry is refused before anything
is sent (issue 29, item 2).

libpq reads its connection string as a C string: a NUL character ends it, and what
followed (database, host, port) is replaced by libpq's defaults, so ``password='p\\x00x'``
used to connect elsewhere and create the store there. Every URL part, query option and
keyword argument is checked by the name the caller used; a password's value is never
shown. The unit cases need no server: connecting fails the test (and the URL names a port
nothing listens on). The last case shows, on the test server, that the schema is not
created in the database libpq's defaults lead to.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg_pool
import pytest
from psycopg.conninfo import conninfo_to_dict

from consensus_lease import InvalidArgument, open_store
from consensus_lease.aio import open_store as aio_open_store
from consensus_lease.backends.postgresql import PostgresBackend
from consensus_lease.backends.postgresql._config import (
    LIBPQ_OPTIONS,
    OPTIONS,
    _listen_conninfo,
)
from consensus_lease.testing.postgresql import fresh_schema, postgres_url

SECRET = "s3cr3t"
NOWHERE = f"postgresql://u:{SECRET}@127.0.0.1:1/db"
"""Nothing listens on port 1: a check that let a value through would fail differently."""


@pytest.fixture
def nothing_sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail the test if anything tries to connect."""

    def refuse(*_a: Any, **_k: Any) -> Any:
        pytest.fail("a connection was attempted for a value that must be refused")

    monkeypatch.setattr(psycopg, "connect", refuse)
    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(refuse))
    monkeypatch.setattr(psycopg_pool, "ConnectionPool", refuse)
    yield


def refused(url: str, **options: object) -> str:
    """The message of the InvalidArgument ``open_store`` raises (fails the test without
    one); it never shows the password."""
    with pytest.raises(InvalidArgument) as info:
        open_store(url, connect_timeout_s=1.0, **options)
    message = str(info.value)
    assert SECRET not in message
    return message


URL_PARTS = {
    "user": f"postgresql://u%00x0x:{SECRET}@127.0.0.1:1/db",
    "password": f"postgresql://u:{SECRET}%00x0x@127.0.0.1:1/db",
    "host": f"postgresql://u:{SECRET}@127.0.0.1%00x0x:1/db",
    "port": f"postgresql://u:{SECRET}@127.0.0.1:1%00/db",
    "dbname": f"postgresql://u:{SECRET}@127.0.0.1:1/db%00x0x",
}


@pytest.mark.parametrize("part", sorted(URL_PARTS))
@pytest.mark.parametrize("form", ["%00", "raw NUL"])
def test_a_nul_in_a_url_part_is_refused_naming_it(part: str, form: str, nothing_sent: None) -> None:
    url = URL_PARTS[part] if form == "%00" else URL_PARTS[part].replace("%00", "\x00")
    message = refused(url + "?schema=s")
    assert f"URL's {part}" in message and "NUL" in message


def test_a_second_hosts_port_is_checked_too(nothing_sent: None) -> None:
    assert "URL's port" in refused("postgresql://u@127.0.0.1:1,[::1]:2%00/db")


@pytest.mark.parametrize("url", [
    f"postgresql://u:{SECRET}%zz@127.0.0.1:1/db",  # libpq: invalid percent-encoded token
    f"postgresql://u:{SECRET}%ff@127.0.0.1:1/db",  # not UTF-8 once decoded
    f"postgresql://u:{SECRET}\udc80@127.0.0.1:1/db",  # UTF-8 cannot encode it
])
def test_a_password_libpq_cannot_read_is_refused_without_its_value(
    url: str, nothing_sent: None
) -> None:
    assert "URL's password" in refused(url)


def test_a_libpq_parser_message_does_not_show_the_password(nothing_sent: None) -> None:
    # libpq quotes the whole URI in this message
    assert "malformed PostgreSQL URL" in refused(f"postgresql://u:{SECRET}@[::1]x/db")


TEXT_OPTIONS = sorted(
    name for name in (*LIBPQ_OPTIONS, "schema")
    if OPTIONS.options[name].kind == "str" and not OPTIONS.options[name].choices
)


@pytest.mark.parametrize("name", TEXT_OPTIONS)
@pytest.mark.parametrize("given", ["query", "keyword"])
def test_a_nul_in_an_option_is_refused_naming_it(name: str, given: str, nothing_sent: None) -> None:
    value = SECRET if name == "password" else "value"  # only a password's is hidden
    if given == "query":
        message = refused(f"{NOWHERE}?{name}={value}%00tail")
    else:
        message = refused(NOWHERE, **{name: f"{value}\x00tail"})
    assert f"option {name}" in message and "NUL" in message


@pytest.mark.parametrize("name", ["ca_file", "cert_file", "key_file"])
def test_a_nul_in_a_file_option_is_refused(name: str, nothing_sent: None) -> None:
    assert name in refused(NOWHERE, **{name: "/etc/hosts\x00tail"})


@pytest.mark.parametrize("name", ["password", "application_name", "host", "options"])
def test_an_unencodable_option_is_refused_naming_it(name: str, nothing_sent: None) -> None:
    value = SECRET if name == "password" else "value"
    assert f"option {name}" in refused(NOWHERE, **{name: f"{value}\udc80"})


@pytest.mark.parametrize("value", [5, b"p", ["p"]])
def test_a_password_that_is_not_a_str_is_refused(value: object, nothing_sent: None) -> None:
    assert "password" in refused(NOWHERE, password=value)


def test_a_conninfo_given_to_the_backend_itself_is_checked(nothing_sent: None) -> None:
    with pytest.raises(InvalidArgument, match="connection string") as info:
        PostgresBackend(f"host=127.0.0.1 port=1 password={SECRET}\x00x0x dbname=db")
    assert SECRET not in str(info.value)


@pytest.mark.parametrize("where", ["keyword", "query"])
def test_a_nul_in_the_password_creates_nothing_in_the_default_database(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's case on the test server: the password is right up to its NUL and
    libpq's defaults (the PG* variables) lead to the same server's ``postgres`` database,
    so before the fix the store opened there and created its schema."""
    base = postgres_url()
    head, _, _dbname = base.rpartition("/")
    password = head.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
    host, port = head.rsplit("@", 1)[1].rsplit(":", 1)
    monkeypatch.setenv("PGHOST", host)
    monkeypatch.setenv("PGPORT", port)
    monkeypatch.setenv("PGDATABASE", "postgres")
    schema = f"t{uuid.uuid4().hex[:12]}"
    try:
        with pytest.raises(InvalidArgument, match="option password"):
            if where == "keyword":
                open_store(f"{base}?schema={schema}", password=f"{password}\x00x",
                           connect_timeout_s=2.0).close()
            else:
                open_store(f"{base}?schema={schema}&password={password}%00x",
                           connect_timeout_s=2.0).close()
    finally:
        with psycopg.connect(f"{head}/postgres", autocommit=True, connect_timeout=5) as side:
            created = side.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                                   (schema,)).fetchone()
            side.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    assert created is None, "the store created its schema in database postgres"


def test_aio_pool_size_is_the_connection_pool_and_threads_the_thread_pool() -> None:
    base = postgres_url()

    async def main() -> None:
        with fresh_schema(base) as schema:
            store = await aio_open_store(f"{base}?schema={schema}", pool_size=3, threads=5)
            try:
                backend = store.sync.backend
                assert isinstance(backend, PostgresBackend)
                assert backend.client._pool_size == 3  # it used to stay 10
                assert store.threads == 5
            finally:
                await store.close()

    asyncio.run(asyncio.wait_for(main(), 60))


@pytest.mark.usefixtures("nothing_sent")
@pytest.mark.parametrize("listen", [
    f"postgresql://u:{SECRET}%00x0x@127.0.0.1:1/db",
    f"postgresql://u:{SECRET}@127.0.0.1:1/db%00x",
    f"postgresql://u:{SECRET}\x00x@127.0.0.1:1/db",
])
def test_listen_url_parts_are_checked_like_the_store_url(listen: str) -> None:
    """``listen_url`` (the direct LISTEN connection behind a pooler) is a libpq URL too:
    a ``%00`` in its password or database would redirect the listener."""
    message = refused(NOWHERE, pooling="transaction", listen_url=listen)
    assert "NUL character" in message


def test_listen_url_inherits_the_store_urls_credentials_unless_it_sets_them() -> None:
    """The store URL's user and password go to a ``listen_url`` that sets none (options
    win over the URL's); a ``listen_url``'s own credentials and host are kept."""
    store = f"postgresql://app:{SECRET}@bouncer:6432/db"
    got = conninfo_to_dict(_listen_conninfo("postgresql://db1:5432/db", {}, store))
    assert (got["user"], got["password"], got["host"], got["port"]) == (
        "app", SECRET, "db1", "5432")
    got = conninfo_to_dict(_listen_conninfo(
        "postgresql://db1:5432/db", {"password": "opt", "sslmode": "require",
                                     "port": "6432"}, store))
    assert (got["user"], got["password"], got["sslmode"], got["port"]) == (
        "app", "opt", "require", "5432")
    got = conninfo_to_dict(_listen_conninfo("postgresql://me:mine@db1/db", {}, store))
    assert (got["user"], got["password"]) == ("me", "mine")


@pytest.mark.parametrize("port", ["abc", "-1", "0", "99999", "5432,x", "5432,", " "])
@pytest.mark.parametrize("given", ["query", "keyword"])
def test_a_bad_port_option_is_refused_before_connecting(
    port: str, given: str, nothing_sent: None
) -> None:
    """Was BackendUnavailable with libpq's text (``abc``), or sent on (``99999``)."""
    message = refused(f"{NOWHERE}?port={port}") if given == "query" \
        else refused(NOWHERE, port=port)
    assert "option port" in message and "1..65535" in message


@pytest.mark.parametrize("port", [-1, 0, 65536, 99999])
def test_an_int_port_out_of_range_is_refused(port: int, nothing_sent: None) -> None:
    assert "1..65535" in refused(NOWHERE, port=port)


def test_a_port_given_as_an_int_or_a_list_connects() -> None:
    """``port=55432`` as an int keyword (was refused: "must be a non-empty str"), and a
    list of one port per host."""
    base = postgres_url()
    parts = conninfo_to_dict(base)
    port = int(parts["port"])
    with fresh_schema(base) as schema:
        for i, (host, given) in enumerate([
            (parts["host"], port), (f"{parts['host']},{parts['host']}", f"{port},{port}"),
        ]):
            store = open_store(base, schema=schema, host=host, port=given)
            try:
                with store.session("w", ttl_s=30.0) as session:
                    assert session.claim(f"job{i}") is not None
            finally:
                store.close()
