"""A ZooKeeper snapshot file written from Python, so that a test server can start with
znodes ZooKeeper itself would take billions of writes to make (a version near 2**31).

The format is the one ``FileSnap.serialize`` of ZooKeeper 3.5-3.8 writes, in Jute's
binary archive (big-endian; a string or buffer is an int length, then the bytes):

    FileHeader  int magic "ZKSN", int version 2, long dbid -1
    sessions    int count (0 here)
    ACL cache   int count (0: every node uses -1, the open ACL that needs no entry)
    nodes       parents first: string path ("" is the root), then DataNode:
                buffer data, long acl, StatPersisted (long czxid, mzxid, ctime, mtime,
                int version, cversion, aversion, long ephemeralOwner, pzxid)
                ... then the string "/" ends the tree
    seal        long Adler-32 of every byte before it, then the string "/"

without the optional digest after the seal (a snapshot without one is read as one from an
older server). Its name says the last zxid applied: ``version-2/snapshot.{zxid:x}``.
"""

from __future__ import annotations

import struct
import time
import zlib
from pathlib import Path

__all__ = ["write_snapshot"]

_SNAP_MAGIC = struct.unpack("!i", b"ZKSN")[0]


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("!i", len(raw)) + raw


def write_snapshot(data_dir: Path, nodes: dict[str, tuple[bytes, int]], zxid: int = 5) -> Path:
    """Write ``data_dir/version-2/snapshot.{zxid:x}`` holding ``nodes`` (absolute path ->
    ``(data, version)``; parents are made with empty data at version 0, as are
    ``/zookeeper`` and ``/zookeeper/quota``). Every node gets czxid = mzxid = ``zxid``,
    no children counted in ``cversion`` (a counter of its own), persistent."""
    tree: dict[str, tuple[bytes, int]] = {"": (b"", 0), "/zookeeper": (b"", 0),
                                          "/zookeeper/quota": (b"", 0)}
    for path, value in nodes.items():
        parts = path.strip("/").split("/")
        for i in range(1, len(parts)):
            tree.setdefault("/" + "/".join(parts[:i]), (b"", 0))
        tree[path] = value
    now_ms = int(time.time() * 1000)
    out = [struct.pack("!iiq", _SNAP_MAGIC, 2, -1), struct.pack("!i", 0), struct.pack("!i", 0)]

    def children(parent: str) -> list[str]:
        prefix = parent + "/"
        return sorted(p for p in tree if p.startswith(prefix) and "/" not in p[len(prefix):]
                      and p != prefix)

    def emit(path: str) -> None:
        data, version = tree[path]
        out.append(_string(path))
        out.append(struct.pack("!i", len(data)) + data)
        out.append(struct.pack("!q", -1))  # the open ACL
        out.append(struct.pack("!qqqqiiiqq", zxid, zxid, now_ms, now_ms, version, 0, 0, 0,
                               zxid))
        for child in children(path):
            emit(child)

    emit("")
    out.append(_string("/"))
    body = b"".join(out)
    sealed = body + struct.pack("!q", zlib.adler32(body)) + _string("/")
    folder = data_dir / "version-2"
    folder.mkdir(parents=True, exist_ok=True)
    snapshot = folder / f"snapshot.{zxid:x}"
    snapshot.write_bytes(sealed)
    return snapshot
