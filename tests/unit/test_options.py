"""The shared option parser: one vocabulary and the same errors on every backend (no
server needed: etcd and ZooKeeper URLs are parsed without connecting)."""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from urllib.parse import parse_qsl

import pytest

from consensus_lease import InvalidArgument, UnsupportedBackend, open_store
from consensus_lease.backends import memory, sqlite
from consensus_lease.backends.etcd import _config as etcd_config
from consensus_lease.backends.zookeeper import _config as zk_options
from consensus_lease.clock import SystemClock
from consensus_lease.options import (
    RENAMED,
    Option,
    OptionTable,
    merge_options,
    query_options,
)
from consensus_lease.validation import check_job_id, check_queue_name

SHARED = ("timeout_s", "connect_timeout_s", "ca_file", "cert_file", "key_file", "user",
          "password")
TABLES = {
    "sqlite": sqlite.OPTIONS,
    "memory": memory.OPTIONS,
    "etcd": etcd_config.OPTIONS,
    "zk": zk_options.OPTIONS,
}
BAD_SECONDS: list[object] = [
    0, -1, 0.0, -0.5, math.nan, math.inf, -math.inf, True, False, None, [1], 10**400,
    "0", "-1", "nan", "inf", "-inf", "abc", "", "1s",
]


def _etcd(url: str, **kwargs: object) -> etcd_config.EtcdConfig:
    return etcd_config.parse_url(url, merge_options(url, kwargs))


def _zk(url: str, **kwargs: object) -> zk_options.ZkConfig:
    return zk_options.parse_url(url, merge_options(url, kwargs))


# -- one vocabulary --------------------------------------------------------------------------


def test_etcd_and_zookeeper_share_the_names() -> None:
    for table in (etcd_config.OPTIONS, zk_options.OPTIONS):
        assert set(SHARED) <= set(table.names)
        kinds = {name: table.options[name].kind for name in SHARED}
        assert kinds == {
            "timeout_s": "seconds", "connect_timeout_s": "seconds", "ca_file": "path",
            "cert_file": "path", "key_file": "path", "user": "str", "password": "str",
        }


def test_zookeeper_url_with_the_shared_names_parses() -> None:
    config = _zk("zk://127.0.0.1:2181/x?timeout_s=2&connect_timeout_s=1")
    assert (config.timeout_s, config.connect_timeout_s) == (2.0, 1.0)


def test_etcd_url_with_the_shared_names_parses() -> None:
    config = _etcd("etcd://127.0.0.1:2379/x?timeout_s=2&connect_timeout_s=1")
    assert (config.timeout_s, config.connect_timeout_s) == (2.0, 1.0)


def test_tls_files_and_credentials_on_etcd_and_zookeeper() -> None:
    files = {"ca_file": __file__, "cert_file": __file__, "key_file": Path(__file__)}
    etcd = _etcd("etcd://h/p?user=u", password="pw", **files)
    assert (etcd.ca_file, etcd.cert_file, etcd.key_file) == (__file__,) * 3
    assert etcd.tls and (etcd.user, etcd.password) == ("u", "pw")
    zk = _zk("zk://h/p?user=u", password="pw", **files)
    assert (zk.ca_file, zk.cert_file, zk.key_file) == (__file__,) * 3
    assert zk.tls and (zk.user, zk.password) == ("u", "pw")
    assert "pw" not in repr(etcd) and "pw" not in repr(zk)


def test_sqlite_and_memory_options(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/x.db?busy_timeout_s=0.5"
    with open_store(url, poll_interval_s="0.01") as store:
        backend = store.backend
        assert isinstance(backend, sqlite.SqliteBackend)
        assert backend.poll_interval_s == 0.01
    with open_store("memory://", store_clock=SystemClock()):
        pass
    with pytest.raises(InvalidArgument, match="Clock"):
        open_store("memory://?store_clock=system")


@pytest.mark.parametrize("module", ["sqlite", "memory", "etcd", "zookeeper"])
def test_every_option_is_in_its_backends_docstring(module: str) -> None:
    package = importlib.import_module(f"consensus_lease.backends.{module}")
    table = TABLES["zk" if module == "zookeeper" else module]
    assert package.__doc__ is not None
    for name in table.names:
        assert name in package.__doc__, f"{name} missing from {module}'s option table"


# -- merging and duplicates ------------------------------------------------------------------


def test_keyword_arguments_override_the_query_string() -> None:
    assert _etcd("etcd://h/p?timeout_s=1", timeout_s=3).timeout_s == 3.0
    assert _zk("zk://h/p?timeout_s=1&connect_timeout_s=4", timeout_s="3").timeout_s == 3.0
    assert merge_options("x://h?a=1&b=2", {"b": 5}) == {"a": "1", "b": 5}
    assert query_options("x://h/p?a=%20b&c=") == {"a": " b", "c": ""}


@pytest.mark.parametrize("query", [
    "a=%20b&c=", "a=1+2&b=x%2By", "a&b=&&c=%E2%82%AC", "p%61ss=%25&x=%7e", "=v&a=b=c",
])
def test_the_query_string_decodes_as_urllib_parse(query: str) -> None:
    """``+`` is a space, ``%XX`` a byte, blank values kept: as ``parse_qsl``."""
    assert query_options(f"x://h/p?{query}") == dict(parse_qsl(query, keep_blank_values=True))


@pytest.mark.parametrize(("url", "problem"), [
    ("postgresql://u@127.0.0.1:9/db?password=sec%zzret", "% not followed by two hex"),
    ("postgresql://u@127.0.0.1:9/db?password=secret%4", "% not followed by two hex"),
    ("postgresql://u@127.0.0.1:9/db?password=sec%ED%A0%80ret", "not UTF-8"),
    ("postgresql://u@127.0.0.1:9/db?application_name=%ED%A0%80", "not UTF-8"),
    ("sqlite:///x.db?busy_timeout_s=1%", "% not followed by two hex"),
    ("zk://127.0.0.1:2181/x?timeout_s=%FF", "not UTF-8"),
])
def test_a_badly_encoded_query_value_is_refused_naming_the_option(
    url: str, problem: str,
) -> None:
    """As the URL's own parts are: never passed on literally, never decoded to U+FFFD;
    the message names the option, never the value (a password)."""
    name = url.split("?")[1].split("=")[0]
    with pytest.raises(InvalidArgument, match=f"option '{name}' .*{problem}") as info:
        open_store(url)
    assert not isinstance(info.value, UnsupportedBackend)
    assert url.split("=", 1)[1] not in str(info.value) and "sec" not in str(info.value)


def test_a_badly_encoded_query_name_is_refused() -> None:
    for query in ("pass%zzword=x", "%ED%A0%80=x"):
        with pytest.raises(InvalidArgument, match="an option name in the URL's query"):
            query_options(f"x://h/p?{query}")


@pytest.mark.parametrize(
    "url",
    [
        "zk://127.0.0.1:2181/x?timeout_s=1&timeout_s=2",
        "etcd://127.0.0.1:2379/x?connect_timeout_s=1&connect_timeout_s=1",
        "sqlite:///x.db?busy_timeout_s=1&busy_timeout_s=1",
        "memory://?a=1&a=1",
    ],
)
def test_a_name_twice_in_the_query_string_is_refused(url: str) -> None:
    with pytest.raises(InvalidArgument, match="given twice") as exc:
        open_store(url)
    assert not isinstance(exc.value, UnsupportedBackend)


# -- unknown and renamed names ---------------------------------------------------------------


@pytest.mark.parametrize("backend", sorted(TABLES))
def test_unknown_option_lists_the_accepted_names(backend: str) -> None:
    table = TABLES[backend]
    with pytest.raises(InvalidArgument) as exc:
        table.parse({"colour": "blue"})
    message = str(exc.value)
    assert "colour" in message
    for name in table.names:
        assert name in message


@pytest.mark.parametrize(
    ("url", "old", "new"),
    [
        ("zk://127.0.0.1:2181/x", "op_timeout_s", "timeout_s"),
        ("zk://127.0.0.1:2181/x", "ca", "ca_file"),
        ("zk://127.0.0.1:2181/x", "certfile", "cert_file"),
        ("zk://127.0.0.1:2181/x", "keyfile", "key_file"),
        ("zk://127.0.0.1:2181/x", "keyfile_password", "key_file_password"),
        ("etcd://127.0.0.1:1/x", "ca_cert", "ca_file"),
        ("etcd://127.0.0.1:1/x", "cert_cert", "cert_file"),
        ("etcd://127.0.0.1:1/x", "cert_key", "key_file"),
    ],
)
def test_an_old_name_names_the_new_one(url: str, old: str, new: str) -> None:
    assert RENAMED[old] == new
    for given in (f"{url}?{old}=2", url):
        with pytest.raises(InvalidArgument, match=f"'{old}' was renamed to '{new}'"):
            open_store(given, **({} if "?" in given else {old: "2"}))


def test_an_old_name_is_merely_unknown_where_the_new_one_is_not_accepted() -> None:
    with pytest.raises(InvalidArgument, match="unknown") as exc:
        open_store("memory://", op_timeout_s=1)
    assert "renamed" not in str(exc.value)


# -- values ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", BAD_SECONDS, ids=repr)
@pytest.mark.parametrize("name", ["timeout_s", "connect_timeout_s"])
def test_bad_seconds_are_refused_on_etcd_and_zookeeper(name: str, bad: object) -> None:
    for parse in (_etcd, _zk):
        with pytest.raises(InvalidArgument, match=name):
            parse(f"{'etcd' if parse is _etcd else 'zk'}://h/p", **{name: bad})


@pytest.mark.parametrize("bad", BAD_SECONDS, ids=repr)
def test_bad_seconds_are_refused_on_sqlite(bad: object, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="busy_timeout_s"):
        open_store(f"sqlite:///{tmp_path}/x.db", busy_timeout_s=bad)


@pytest.mark.parametrize("good", [0.25, 1, "2", " 3.5 ", "1e-3", 10**6])
def test_good_seconds(good: object) -> None:
    assert _etcd("etcd://h/p", timeout_s=good).timeout_s == float(good)  # type: ignore[arg-type]


def test_other_kinds() -> None:
    table = OptionTable(
        "test",
        [
            Option("n", "int", 3, minimum=0, maximum=10),
            Option("f", "bool", False),
            Option("mode", "str", "a", choices=("a", "b")),
            Option("secret", "str", None, secret=True),
            Option("file", "path", None),
        ],
    )
    parsed = table.parse({"n": "7", "f": "Yes", "mode": "b", "file": __file__})
    assert (parsed.integer("n"), parsed.flag("f"), parsed.text("mode")) == (7, True, "b")
    assert parsed.text("file") == __file__ and parsed.text("secret") is None
    assert parsed.given == {"n", "f", "mode", "file"}
    defaults = table.parse({})
    assert (defaults.integer("n"), defaults.flag("f"), defaults.text("mode")) == (3, False, "a")
    for bad in ({"n": "1.5"}, {"n": True}, {"n": 11}, {"n": "-1"}, {"f": "maybe"}, {"f": 1},
                {"mode": "c"}, {"mode": ""}, {"file": "/nonexistent"}, {"file": 5},
                {"secret": 5}):
        with pytest.raises(InvalidArgument):
            table.parse(bad)
    with pytest.raises(InvalidArgument) as exc:
        table.parse({"secret": ""})
    assert "(hidden)" in str(exc.value)
    with pytest.raises(TypeError):
        parsed.seconds("mode")
    with pytest.raises(ValueError, match="twice"):
        OptionTable("test", [Option("n", "int", 1), Option("n", "int", 2)])


def test_none_for_an_unset_option_leaves_it_unset() -> None:
    config = _etcd("etcd://h/p", user=None, password=None, ca_file=None)
    assert (config.user, config.password, config.ca_file) == (None, None, None)
    with pytest.raises(InvalidArgument):
        _etcd("etcd://h/p", timeout_s=None)


# -- queue names -----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "a\x00b", "x" * 257, 5, "\ud800"])
def test_queue_names_say_queue_name(bad: object) -> None:
    with pytest.raises(InvalidArgument, match="queue name"):
        check_queue_name(bad)
    with pytest.raises(InvalidArgument, match="job id"):
        check_job_id(bad)
    with open_store("memory://") as store:
        with pytest.raises(InvalidArgument, match="queue name"):
            store.enqueue(bad, "job")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="queue name"):
            store.queue_jobs(bad)  # type: ignore[arg-type]
        with store.session("A", 30) as session, pytest.raises(InvalidArgument, match="queue name"):
            session.claim_next(bad)  # type: ignore[arg-type]
    assert check_queue_name("q") == "q"


def test_sqlite_create_false_opens_only_an_existing_store(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    for given in ({"create": False}, {"create": "false"}, {}):
        url = f"sqlite:///{missing}" + ("" if given else "?create=no")
        with pytest.raises(InvalidArgument, match=r"no SQLite store at .*create=false"):
            open_store(url, **given)
    assert not missing.exists()
    with pytest.raises(InvalidArgument, match="create must be true or false"):
        open_store(f"sqlite:///{missing}", create="maybe")
    with open_store(f"sqlite:///{missing}"):  # the default creates it
        pass
    with open_store(f"sqlite:///{missing}", create=False) as store:
        assert store.records() == []


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:s3cret@db:5432/jobs?schema=q", "postgresql://app:***@db:5432/jobs?schema=q"),
        ("etcd://h:2379/p?user=root&password=pw&timeout_s=1", "etcd://h:2379/p?user=root&password=***&timeout_s=1"),
        ("zk://h:2181/c?PASSWORD=x", "zk://h:2181/c?PASSWORD=***"),
        ("sqlite:////tmp/a.db", "sqlite:////tmp/a.db"),
        ("postgresql://app@db/jobs", "postgresql://app@db/jobs"),
    ],
)
def test_urls_in_messages_never_show_a_password(url: str, shown: str) -> None:
    from consensus_lease.options import redact_url

    assert redact_url(url) == shown


def test_an_unknown_scheme_error_hides_the_password() -> None:
    from consensus_lease import open_store
    from consensus_lease.errors import UnsupportedBackend

    with pytest.raises(UnsupportedBackend) as error:
        open_store("nosuch://app:s3cret@db/jobs")
    assert "s3cret" not in str(error.value) and "app:***@db" in str(error.value)


@pytest.mark.parametrize("scheme", ["etcd", "zk"])
@pytest.mark.parametrize("port", ["\u00b2", "\u0662\u0661\u0668\u0661", "\uff12\uff11"])
def test_a_port_of_other_scripts_digits_is_a_bad_url(scheme: str, port: str) -> None:
    """``str.isdigit`` is true of superscripts (``int()`` refuses them: a bare
    ValueError) and of Arabic-Indic digits (``int()`` takes them: port 2181 silently)."""
    pytest.importorskip("grpc" if scheme == "etcd" else "kazoo")
    with pytest.raises(UnsupportedBackend, match="bad port"):
        open_store(f"{scheme}://127.0.0.7:{port}/x")


@pytest.mark.parametrize("url", [
    "zk://127.0.0.7:" + "9" * 5000 + "/x", "etcd://127.0.0.7:" + "9" * 5000,
])
def test_a_port_of_thousands_of_digits_is_a_bad_url(url: str) -> None:
    """``int()`` refuses more than 4,300 digits with its own ValueError."""
    pytest.importorskip("grpc" if url.startswith("etcd") else "kazoo")
    with pytest.raises(UnsupportedBackend, match="bad port"):
        open_store(url)


@pytest.mark.parametrize("value", ["9" * 5000, "\u0663", "1_0", "\u00a05"])
def test_an_integer_option_of_odd_text_is_refused_naming_it(value: str) -> None:
    with pytest.raises(InvalidArgument, match="option wal_limit_bytes must be an integer") as e:
        open_store("sqlite:///unused.db", wal_limit_bytes=value)
    assert len(str(e.value)) < 200


@pytest.mark.parametrize("value", ["\u0663", "1_0"])
def test_a_seconds_option_of_odd_text_is_refused(value: str) -> None:
    with pytest.raises(InvalidArgument, match="busy_timeout_s must be a finite number"):
        open_store("sqlite:///unused.db", busy_timeout_s=value)
