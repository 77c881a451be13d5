"""A throw-away PostgreSQL primary and its asynchronous streaming standby, for failover
tests.

Not the shared server of ``scripts/start-postgres.sh`` (other tests use it; it is never
reconfigured): a new cluster made with ``initdb`` in a temporary directory, the primary on
127.0.0.81 and the standby (``pg_basebackup -R``) on 127.0.0.82, each on a free port, with
the binaries of the same installation (Debian's ``postgresql`` package, which
``scripts/start-postgres.sh`` installs). As root the servers run as the ``postgres`` user.
Trust authentication: both listen on loopback addresses only and live for one test.

To make the standby lag at promotion (what an asynchronous standby has after its primary
dies): :meth:`StandbyPair.cut_replication` rejects replication connections in the
primary's ``pg_hba.conf`` and ends the WAL sender (pausing replay is not enough: received
WAL is replayed on promote). :meth:`StandbyPair.close` stops both servers (``immediate``
shutdown, then SIGKILL by the PID in ``postmaster.pid``) and removes the directory; the
fixture calls it also when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from consensus_lease.testing.conformance import poll_until

PRIMARY_HOST = "127.0.0.81"
STANDBY_HOST = "127.0.0.82"
USER = "t"


def bindir() -> Path | None:
    """The newest installed PostgreSQL server binaries (Debian keeps them off PATH)."""
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                    key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
                    reverse=True):
        if (d / "initdb").exists() and (d / "pg_basebackup").exists():
            return d
    return None


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class StandbyPair:
    """A primary and its streaming standby (see the module docstring)."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="cl-pg-failover-", dir="/tmp"))
        self.as_root = os.geteuid() == 0
        if self.as_root:
            shutil.chown(self.root, "postgres")
        self.primary = self.root / "primary"
        self.standby = self.root / "standby"
        self.ports = {PRIMARY_HOST: _free_port(PRIMARY_HOST),
                      STANDBY_HOST: _free_port(STANDBY_HOST)}

    # -- set-up --------------------------------------------------------------------------

    def _run(self, *args: str) -> None:
        cmd = [str(a) for a in args]
        if self.as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stdout}{done.stderr}")

    def _start(self, data: Path, host: str) -> None:
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(data), "-l", str(self.root / f"{host}.log"),
            "-w", "-t", "30", "-o",
            f"-c listen_addresses={host} -p {self.ports[host]} -k {self.root} "
            "-c fsync=off -c wal_level=replica -c max_wal_senders=4 "
            "-c wal_receiver_status_interval=1 -c wal_retrieve_retry_interval=200",
            "start",
        )

    def start(self) -> None:
        """initdb, start the primary, pg_basebackup the standby, start it."""
        self._run(str(self.bin / "initdb"), "-D", str(self.primary), "-U", USER,
                  "--auth=trust", "-N", "-E", "UTF8", "--no-locale")
        (self.primary / "pg_hba.conf").write_text(
            "local all all trust\n"
            "host all all 127.0.0.0/8 trust\n"
            "host replication all 127.0.0.0/8 trust\n"
        )
        self._start(self.primary, PRIMARY_HOST)
        self._run(str(self.bin / "pg_basebackup"), "-h", PRIMARY_HOST,
                  "-p", str(self.ports[PRIMARY_HOST]), "-U", USER, "-D", str(self.standby),
                  "-R", "-X", "stream", "-c", "fast")
        self._start(self.standby, STANDBY_HOST)
        poll_until(lambda: self._sql(PRIMARY_HOST, "SELECT count(*) FROM pg_stat_replication "
                                     "WHERE state = 'streaming'") == 1, 30.0)

    # -- addresses -----------------------------------------------------------------------

    def url(self, **options: str) -> str:
        """A store URL naming both servers, the writable one chosen at connect
        (``target_session_attrs=read-write``): a client's view of a failover."""
        query = "&".join(f"{k}={v}" for k, v in
                         {"target_session_attrs": "read-write", **options}.items())
        return (f"postgresql://{USER}@{PRIMARY_HOST}:{self.ports[PRIMARY_HOST]},"
                f"{STANDBY_HOST}:{self.ports[STANDBY_HOST]}/postgres?{query}")

    def _sql(self, host: str, sql: str) -> object:
        with psycopg.connect(host=host, port=self.ports[host], user=USER, dbname="postgres",
                             autocommit=True, connect_timeout=5) as conn:
            row = conn.execute(sql).fetchone()
        return None if row is None else row[0]

    # -- faults --------------------------------------------------------------------------

    def wait_replayed(self) -> None:
        """Until the standby has replayed everything the primary wrote so far."""
        lsn = self._sql(PRIMARY_HOST, "SELECT pg_current_wal_lsn()::text")
        poll_until(lambda: self._sql(
            STANDBY_HOST, f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn") is True, 30.0)

    def cut_replication(self) -> None:
        """The standby receives nothing more: replication connections rejected, the WAL
        sender ended (and none back)."""
        hba = self.primary / "pg_hba.conf"
        hba.write_text("host replication all 127.0.0.0/8 reject\n" + hba.read_text())
        self._sql(PRIMARY_HOST, "SELECT pg_reload_conf()")
        # Until the WAL sender stays away (none on two looks 0.3 s apart, longer than the
        # standby's retry interval: a reconnect before the reload applied is ended too).
        since: list[float] = []

        def gone() -> bool:
            ended = self._sql(PRIMARY_HOST, "SELECT count(pg_terminate_backend(pid)) "
                              "FROM pg_stat_replication")
            if ended != 0:
                since.clear()
                return False
            since.append(time.monotonic())
            return since[-1] - since[0] >= 0.3

        poll_until(gone, 30.0)

    def kill_primary(self) -> None:
        """The primary stops at once, as in a crash (``immediate`` shutdown)."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.primary), "-m", "immediate",
                  "-w", "stop")

    def promote(self) -> None:
        """Promote the standby (returns once it accepts writes)."""
        assert self._sql(STANDBY_HOST, "SELECT pg_promote(true, 30)") is True

    def standby_sql(self, sql: str) -> object:
        """The first column of the first row of ``sql`` on the standby."""
        return self._sql(STANDBY_HOST, sql)

    # -- tear-down -----------------------------------------------------------------------

    def close(self) -> None:
        """Stop both servers (this pair's only) and remove the directory."""
        for data in (self.primary, self.standby):
            if not (data / "postmaster.pid").exists():
                continue
            with contextlib.suppress(Exception):
                self._run(str(self.bin / "pg_ctl"), "-D", str(data), "-m", "immediate",
                          "-w", "-t", "10", "stop")
            pid_file = data / "postmaster.pid"
            with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
                pid = int(pid_file.read_text().split("\n", 1)[0])
                os.kill(pid, signal.SIGKILL)  # still there: the postmaster we started
                deadline = time.monotonic() + 10.0
                while time.monotonic() < deadline:
                    os.kill(pid, 0)
                    time.sleep(0.05)  # poll interval of a deadline loop (until the pid is gone)
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def standby_pair() -> Iterator[StandbyPair]:
    """A started :class:`StandbyPair`, closed on exit (also on failure). Skips without
    PostgreSQL's server binaries (fails under ``CI=true``: ``make test`` installs them)."""
    bin_dir = bindir()
    if bin_dir is None:
        reason = ("PostgreSQL server binaries not found under /usr/lib/postgresql "
                  "(bash scripts/start-postgres.sh installs them as root)")
        if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    pair = StandbyPair(bin_dir)
    try:
        pair.start()
        yield pair
    finally:
        pair.close()
