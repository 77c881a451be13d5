"""Find or start the local Docker engine, and look up the cluster images.

The cluster kit (:mod:`consensus_lease.testing.cluster`) runs every etcd and
ZooKeeper member as a container on the local engine. On the machines this
project targets no engine runs by default, so :func:`ensure_engine` starts
``dockerd --bridge=none --iptables=false --ip-masq=false`` itself (there is no
bridge: members use host networking on their own 127.0.0.x address).

This module uses the standard library only -- it talks to the engine's HTTP
API over its unix socket -- so ``docker/start-engine.sh`` can run it with the
system ``python3`` before any virtualenv exists::

    python3 -m consensus_lease.testing.engine --timeout-s 60

Errors: every failure is an :class:`EngineUnavailable` whose message names
what is missing and how to get it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

DOCKER_SOCKET = Path("/var/run/docker.sock")
DOCKERD_PID_FILE = Path("/var/run/docker.pid")
DEFAULT_DOCKERD_LOG = Path("/var/log/consensus-lease-dockerd.log")
DOCKERD_ARGS = ("--bridge=none", "--iptables=false", "--ip-masq=false")

ETCD_IMAGE_ENV = "CONSENSUS_LEASE_ETCD_IMAGE"
ZOOKEEPER_IMAGE_ENV = "CONSENSUS_LEASE_ZOOKEEPER_IMAGE"
IMAGE_STYLE_ENV = "CONSENSUS_LEASE_IMAGE_STYLE"
KIT_STYLE = "kit"
"""Our own images (``consensus-lease kit build-images``); ZooKeeper takes ``zk-member``."""
UPSTREAM_STYLE = "upstream"
"""Images following the published ones' conventions: etcd's binary with flags, the
official ``zookeeper`` image's ``ZOO_*`` variables and entrypoint."""
IMAGE_STYLES = (KIT_STYLE, UPSTREAM_STYLE)
DEFAULT_ETCD_IMAGE = "consensus-lease/etcd:3.4"
DEFAULT_ZOOKEEPER_IMAGE = "consensus-lease/zookeeper:3.8"
UPSTREAM_ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.17"
UPSTREAM_ZOOKEEPER_IMAGE = "zookeeper:3.8"
LOOKALIKE_ETCD_IMAGE = "consensus-lease-lookalike/etcd:3.4"
LOOKALIKE_ZOOKEEPER_IMAGE = "consensus-lease-lookalike/zookeeper:3.8"
ZOOKEEPER_HEAP_MB = 640
"""JVM heap (``-Xmx``, MiB) of every ZooKeeper server we ship: the kit's default
(``ZooKeeperCluster(heap_mb=...)``), the kit image's default ``JVMFLAGS`` (a build
argument of its recipe), ``docker/docker-compose.yml`` and ``docker/README.md``.

Sized by the rule measured at the store limit (``docs/capacity.md``, "Measured at the
limit"; ``heap_needed_mb`` in ``consensus_lease.backends.zookeeper._queues_capacity``)
for the store's default limits (``store_max_jobs`` 30,000, ``store_max_bytes`` 16 MiB)
with bulk enqueues (multis of ``ENQUEUE_MULTI_BYTES`` = 160 KiB in the committed log)::

    16 MiB + 3.5 x 500 x 160 KiB + 2.5 x (30,000 x 3 KiB + 16 MiB)
      = 16 + 273.4 + 2.5 x (87.9 + 16.0) ≈ 549 MiB

640 MiB leaves ~70 MiB over that (the serial collector uses ~97 % of ``-Xmx``: one
survivor space stays empty). Measured with it (``benchmarks/zk_heap_resync.py``, the
store full to both limits, 600 writes of 160 KB while a member was away, rejoins of a
follower, the leader and a frozen leader, by DIFF and by SNAP): at most ~356 MiB live
after a full collection, every member kept serving. 256 MiB, the figure before, lost a
rejoining follower to ``OutOfMemoryError``. Stock ZooKeeper's ``zkServer.sh`` gives
1000 MiB (``ZK_SERVER_HEAP``). Tests that want a small heap pass ``heap_mb``.
"""


class EngineUnavailable(RuntimeError):
    """No Docker engine answers and none could be started; the message says why."""


def image_style(style: str | None = None) -> str:
    """``style`` if given, else ``$CONSENSUS_LEASE_IMAGE_STYLE``, else ``"kit"``.

    Raises:
        ValueError: the style is neither ``"kit"`` nor ``"upstream"``.
    """
    chosen = (style or os.environ.get(IMAGE_STYLE_ENV) or KIT_STYLE).strip().lower()
    if chosen not in IMAGE_STYLES:
        raise ValueError(
            f"unknown image style {chosen!r} (from {IMAGE_STYLE_ENV} or the option); "
            f"choose one of {', '.join(IMAGE_STYLES)}"
        )
    return chosen


def etcd_image(style: str | None = None) -> str:
    """Image name for etcd members: ``$CONSENSUS_LEASE_ETCD_IMAGE``, else the default of
    the image style (:func:`image_style`)."""
    default = UPSTREAM_ETCD_IMAGE if image_style(style) == UPSTREAM_STYLE else DEFAULT_ETCD_IMAGE
    return os.environ.get(ETCD_IMAGE_ENV) or default


def zookeeper_image(style: str | None = None) -> str:
    """Image name for ZooKeeper members: ``$CONSENSUS_LEASE_ZOOKEEPER_IMAGE``, else the
    default of the image style (:func:`image_style`)."""
    upstream = image_style(style) == UPSTREAM_STYLE
    default = UPSTREAM_ZOOKEEPER_IMAGE if upstream else DEFAULT_ZOOKEEPER_IMAGE
    return os.environ.get(ZOOKEEPER_IMAGE_ENV) or default


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: Path, timeout_s: float) -> None:
        super().__init__("localhost", timeout=timeout_s)
        self._socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(str(self._socket_path))
        self.sock = sock


def _engine_get(path: str, socket_path: Path, timeout_s: float) -> tuple[int, bytes]:
    conn = _UnixHTTPConnection(socket_path, timeout_s)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def engine_request(
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 10.0,
    socket_path: Path = DOCKER_SOCKET,
) -> tuple[int, bytes]:
    """One request to the engine's HTTP API; returns (status, whole body).

    Raises:
        OSError: the engine's socket did not answer within ``timeout_s`` seconds.
    """
    conn = _UnixHTTPConnection(socket_path, timeout_s)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def engine_answers(socket_path: Path = DOCKER_SOCKET, timeout_s: float = 2.0) -> bool:
    """True when an engine answers ``GET /_ping`` on ``socket_path`` within ``timeout_s``."""
    try:
        status, body = _engine_get("/_ping", socket_path, timeout_s)
    except OSError:
        return False
    return status == 200 and body.strip() == b"OK"


def missing_images(names: list[str] | None = None, socket_path: Path = DOCKER_SOCKET) -> list[str]:
    """The image names among ``names`` (default: both kit images) the engine lacks."""
    wanted = names if names is not None else [etcd_image(), zookeeper_image()]
    missing = []
    for name in wanted:
        status, _ = _engine_get(
            f"/images/{urllib.parse.quote(name, safe='')}/json", socket_path, 10.0
        )
        if status != 200:
            missing.append(name)
    return missing


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _other_dockerd_alive(own_pid: int) -> bool:
    try:
        pid = int(DOCKERD_PID_FILE.read_text().strip())
    except (OSError, ValueError):
        return False
    if pid == own_pid:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def ensure_engine(
    timeout_s: float = 60.0,
    socket_path: Path = DOCKER_SOCKET,
    log_path: Path = DEFAULT_DOCKERD_LOG,
) -> str:
    """Make sure a Docker engine answers on ``socket_path``; start ``dockerd`` if not.

    Idempotent: when an engine already answers nothing is started. Otherwise
    ``dockerd`` is started detached (its own session, output appended to
    ``log_path``) and polled until it answers or ``timeout_s`` (seconds) pass.

    Returns a one-line description of what was found or done.

    Raises:
        EngineUnavailable: not root, ``dockerd`` not installed, ``dockerd``
            exited, or it did not answer before the deadline (it is then left
            running; its pid and log tail are in the message).
    """
    if engine_answers(socket_path):
        return f"docker engine already answers on {socket_path}"
    if os.geteuid() != 0:
        raise EngineUnavailable(
            f"no Docker engine answers on {socket_path}, and starting dockerd needs root"
        )
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise EngineUnavailable(
            "no Docker engine answers and dockerd is not installed "
            "(run docker/install-deps.sh or apt-get install -y docker.io)"
        )
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [dockerd, *DOCKERD_ARGS],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if engine_answers(socket_path, timeout_s=1.0):
            return f"started dockerd pid {proc.pid} (log: {log_path})"
        if proc.poll() is not None and not _other_dockerd_alive(proc.pid):
            raise EngineUnavailable(
                f"dockerd exited with status {proc.returncode}; last lines of {log_path}:\n"
                + _tail(log_path)
            )
        time.sleep(0.2)
    raise EngineUnavailable(
        f"dockerd (pid {proc.pid}) did not answer on {socket_path} within {timeout_s:.0f} s; "
        f"last lines of {log_path}:\n" + _tail(log_path)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    parser.add_argument("--log", type=Path, default=DEFAULT_DOCKERD_LOG)
    parser.add_argument(
        "--check-images",
        action="store_true",
        help="also exit 2 when the cluster images are missing (names them as JSON)",
    )
    args = parser.parse_args(argv)
    try:
        print(ensure_engine(timeout_s=args.timeout_s, log_path=args.log))
    except EngineUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.check_images:
        missing = missing_images()
        if missing:
            print(json.dumps({"missing_images": missing}))
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
