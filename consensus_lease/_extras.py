"""Which optional extra of ``consensus_lease`` provides which library: the one place the
"pip install ..." hints come from.

The base install needs only the standard library (the memory and SQLite stores, fences
on SQLite, the lease protocol). Everything else is an extra declared in pyproject.toml;
the tables here must name the same extras.
"""

from __future__ import annotations

__all__ = [
    "BACKEND_EXTRAS",
    "DISTRIBUTION",
    "MODULE_EXTRAS",
    "install_hint",
    "missing_dependency",
    "needs_extra",
]

DISTRIBUTION = "consensus_lease"

BACKEND_EXTRAS: dict[str, str] = {
    "etcd": "etcd",
    "zk": "zookeeper",
    "zookeeper": "zookeeper",
    "postgresql": "postgresql",
    "postgres": "postgresql",
}
"""URL scheme of a backend this distribution ships -> the extra its client needs."""

MODULE_EXTRAS: dict[str, str] = {
    "rich": "cli",
    "grpc": "etcd",
    "pyetcd": "etcd",
    "google": "etcd",  # protobuf
    "tenacity": "etcd",
    "kazoo": "zookeeper",
    "psycopg": "postgresql",
    "psycopg_pool": "postgresql",
    "sqlalchemy": "sql",
    "prometheus_client": "metrics",
    "opentelemetry": "otel",
    "celery": "celery",
    "kombu": "celery",
    "billiard": "celery",
    "pytest": "testing",
    "hypothesis": "testing",
    "testcontainers": "testing",
    "docker": "testing",
    "matplotlib": "bench",
    "tooz": "tooz",
    "etcd3gw": "bench",
    "pyinstrument": "bench",
}
"""Top-level import name of an optional library -> the extra that installs it."""


def install_hint(extra: str) -> str:
    """The command that installs ``extra``, quoted for a POSIX shell (the brackets)."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def missing_dependency(exc: ImportError) -> str | None:
    """The top-level name of the library whose absence caused ``exc``, or ``None`` when
    ``exc`` is not about a missing library (another ImportError, or a module of this
    package itself missing: a broken install, which no extra fixes)."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.partition(".")[0]
    return None if top == DISTRIBUTION else top


def needs_extra(exc: ModuleNotFoundError, extra: str, what: str) -> ModuleNotFoundError:
    """``exc`` (a library missing while ``what`` was imported) retold with the command that
    installs ``extra``; the same type and ``name``, so ``except ImportError`` still works.
    ``exc`` itself when the missing module is part of this package (a broken install)."""
    missing = missing_dependency(exc)
    if missing is None:
        return exc
    return ModuleNotFoundError(
        f"{what} needs {missing!r}, which is not installed: {install_hint(extra)}",
        name=exc.name)
