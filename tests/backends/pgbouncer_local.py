"""A real PgBouncer (Debian 12: 1.18) in front of the test PostgreSQL, as a subprocess.

``docker/install-deps.sh`` installs the ``pgbouncer`` package (``make test`` runs it as
root); without the binary the tests that need it skip, and fail under ``CI=true``.
Each :func:`pgbouncer` listens on its own loopback address (127.0.248.1, away from the
other helpers' 127.0.250/251.x) on a free port, forwards database ``consensus_lease`` to
the server of ``CONSENSUS_LEASE_POSTGRES_URL`` (``auth_type = plain``, an ``auth_file``
with the test role's password), runs as user ``postgres`` when started by root
(PgBouncer refuses to run as root), and is ended by its PID at exit.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
ADDRESS = "127.0.248.1"


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def require() -> None:
    """Skip the calling test without the pgbouncer binary (fail it under ``CI=true``)."""
    if Path(PGBOUNCER).exists():
        return
    reason = "pgbouncer is not installed (bash docker/install-deps.sh, as root)"
    if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason} (CI=true: the PgBouncer tests must run)", pytrace=False)
    pytest.skip(reason)


@contextmanager
def pgbouncer(
    server_url: str, *, pool_mode: str = "transaction", pool_size: int = 4,
    ignore_startup_parameters: str = "",
) -> Iterator[str]:
    """Run PgBouncer in front of ``server_url`` (a libpq URI with user and password);
    yield the URL of the same database through it."""
    require()
    server = conninfo_to_dict(server_url)
    user, password, dbname = server["user"], server["password"], server["dbname"]
    port = _free_port(ADDRESS)
    work = Path(tempfile.mkdtemp(prefix="cl-pgbouncer-"))
    (work / "userlist.txt").write_text(f'"{user}" "{password}"\n')
    ini = work / "pgbouncer.ini"
    ini.write_text("\n".join([
        "[databases]",
        f"{dbname} = host={server['host']} port={server['port']} dbname={dbname}",
        "[pgbouncer]",
        f"listen_addr = {ADDRESS}",
        f"listen_port = {port}",
        "unix_socket_dir =",
        "auth_type = plain",
        f"auth_file = {work / 'userlist.txt'}",
        f"logfile = {work / 'pgbouncer.log'}",
        f"pool_mode = {pool_mode}",
        f"default_pool_size = {pool_size}",
        "max_client_conn = 500",
        "server_lifetime = 3600",
        f"ignore_startup_parameters = {ignore_startup_parameters}",
        "",
    ]))
    args = [PGBOUNCER, str(ini)]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        account = pwd.getpwnam("postgres")
        for path in (work, *work.iterdir()):
            os.chown(path, account.pw_uid, account.pw_gid)
        args = [PGBOUNCER, "-u", "postgres", str(ini)]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 15.0
        while True:
            with suppress(OSError), socket.create_connection((ADDRESS, port), timeout=1.0):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                err = process.stderr.read().decode(errors="replace") if process.stderr else ""
                log = (work / "pgbouncer.log").read_text(errors="replace") \
                    if (work / "pgbouncer.log").exists() else ""
                raise RuntimeError(f"pgbouncer did not start: {err}\n{log[-2000:]}")
            time.sleep(0.02)  # poll interval of a deadline loop (until it accepts connections)
        yield f"postgresql://{user}:{password}@{ADDRESS}:{port}/{dbname}"
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)  # SIGINT: PgBouncer's immediate shutdown
            try:
                process.wait(10.0)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10.0)
        if process.stderr is not None:
            process.stderr.close()
        shutil.rmtree(work, ignore_errors=True)
