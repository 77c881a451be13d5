"""W6: acquire+release cycles/s of other Python lock libraries on the same store, next
to ours (``session.claim(job)`` + ``lease.release()``), one client, one lock name,
uncontended.

========================  ==========  ===============================================
peer                      store       one cycle
========================  ==========  ===============================================
ours                      both        claim txn/multi, release txn/multi
pyetcd ``Lock``           etcd        LeaseGrant + txn, then txn (a new lease per
                                      acquire, never revoked: it expires)
tooz ``etcd3gw``          etcd        the same over etcd's JSON gateway (``/v3``)
kazoo ``Lock``            ZooKeeper   create sequential ephemeral + get_children, delete
tooz ``zookeeper``        ZooKeeper   kazoo's ``Lock`` behind tooz's API
tooz ``postgresql``       PostgreSQL  ``pg_try_advisory_lock``, ``pg_advisory_unlock``
                                      (psycopg2)
raw client                every one   W1's raw claim+complete (:mod:`.raw`) on a new
                                      job id per cycle: two requests, no lock logic
========================  ==========  ===============================================

The raw client's row is no peer but the ceiling: any acquire+release of two requests
on that client is at best that fast, so ``raw / peer`` is the most a two-request lock
can be ahead of a peer on this machine (the goal table shows it next to each goal).

None of the peers hands out a fencing token: a paused holder's late write cannot be
rejected by the destination. Ours hands out ``lease.generation``.

The leases the etcd peers leak are revoked after each timed loop (see
:class:`_LeaseLeak`), so their expiry does not slow the next library's measurement.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..store import open_store
from .config import Sizes, Target
from .raw import raw_cycler
from .stats import median
from .windows import Windows, paired_ratios, spread

__all__ = ["w6_peers"]


@dataclass
class Peer:
    name: str
    library: str
    fencing: bool
    open: Callable[[], Any]
    """Returns ``(cycle, close)``: two callables."""


class _LeaseLeak:
    """pyetcd's ``Lock`` and tooz's etcd3gw lock grant a new etcd lease on every acquire
    and never revoke it; thousands then expire together on the server while the *next*
    library is being measured. This records every lease the client grants (by wrapping
    the client instance's ``lease``) so they can be revoked after the timed loop, outside
    the measurement."""

    LIMIT = 100_000

    def __init__(self, client: Any) -> None:
        self.leases: list[Any] = []
        grant = client.lease

        def recording_grant(*args: Any, **kwargs: Any) -> Any:
            lease = grant(*args, **kwargs)
            if len(self.leases) < self.LIMIT:
                self.leases.append(lease)
            return lease

        setattr(client, "lease", recording_grant)  # noqa: B010

    def revoke_all(self) -> None:
        for lease in self.leases:
            try:
                lease.revoke()
            except Exception:  # already expired or revoked: fine
                continue
        self.leases.clear()


def _ours(target: Target, ttl_s: float, job: str) -> Peer:
    def opener() -> Any:
        assert target.url is not None
        store = open_store(target.url)
        session = store.session("bench-w6", ttl_s)

        def cycle() -> None:
            lease = session.claim(job)
            if lease is None:
                raise RuntimeError("uncontended claim refused")
            lease.release()

        def close() -> None:
            session.close()
            store.close()

        return cycle, close

    return Peer("consensus_lease (claim+release)", "consensus_lease", True, opener)


def _pyetcd_lock(target: Target, ttl_s: float, name: str) -> Peer:
    def opener() -> Any:
        import pyetcd

        client = pyetcd.client(host=target.raw["host"], port=int(target.raw["port"]), timeout=10)
        leak = _LeaseLeak(client)
        lock = client.lock(name, ttl=int(ttl_s))

        def cycle() -> None:
            if not lock.acquire(timeout=10):
                raise RuntimeError("pyetcd Lock not acquired")
            if not lock.release():
                raise RuntimeError("pyetcd Lock release refused")

        def close() -> None:
            leak.revoke_all()
            client.close()

        return cycle, close

    return Peer("pyetcd Lock", "etcd-sdk-python", False, opener)


def _tooz(url: str, name: str, label: str) -> Peer:
    def opener() -> Any:
        from tooz import coordination

        coordinator = coordination.get_coordinator(url, f"bench-{uuid.uuid4().hex[:8]}".encode())
        coordinator.start()
        client = getattr(coordinator, "client", None)  # the etcd3gw driver's client
        leak = _LeaseLeak(client) if url.startswith("etcd3") and client is not None else None
        lock = coordinator.get_lock(name.encode())

        def cycle() -> None:
            if not lock.acquire(blocking=True):
                raise RuntimeError("tooz lock not acquired")
            if not lock.release():
                raise RuntimeError("tooz lock release refused")

        def close() -> None:
            if leak is not None:
                leak.revoke_all()
            coordinator.stop()

        return cycle, close

    return Peer(label, "tooz", False, opener)


def _kazoo_lock(target: Target, name: str) -> Peer:
    def opener() -> Any:
        from kazoo.client import KazooClient

        client = KazooClient(hosts=target.raw["hosts"], timeout=10.0)
        client.start(timeout=15.0)
        lock = client.Lock(f"{target.raw['peers']}/{name}", "bench")

        def cycle() -> None:
            if not lock.acquire(timeout=10):
                raise RuntimeError("kazoo Lock not acquired")
            lock.release()

        def close() -> None:
            client.stop()
            client.close()

        return cycle, close

    return Peer("kazoo Lock", "kazoo", False, opener)


RAW_FLOOR = "raw"
"""``Peer.library`` of the raw client's row: a ceiling, not a peer (no goal of its own)."""


def _raw_floor(target: Target, prefix: str) -> Peer:
    def opener() -> Any:
        cycler = raw_cycler(target.raw)
        cycler.open()
        run = uuid.uuid4().hex[:8]  # each repeat opens again: new job ids every time
        n = iter(range(10_000_000))

        def cycle() -> None:
            cycler.cycle(f"{prefix}-{run}-{next(n)}")

        return cycle, cycler.close

    return Peer("raw client (2 requests, no lock logic)", RAW_FLOOR, False, opener)


def peers_for(target: Target, sizes: Sizes, prefix: str) -> list[Peer]:
    """Ours first, then each peer library, then the raw client's ceiling."""
    ours = _ours(target, sizes.session_ttl_s, f"{prefix}-lock")
    floor = _raw_floor(target, f"{prefix}-raw")
    if target.backend == "etcd":
        gateway = f"etcd3+{target.raw['gateway']}?api_version=v3&timeout=10"
        return [ours, _pyetcd_lock(target, sizes.session_ttl_s, f"{prefix}-pyetcd"),
                _tooz(gateway, f"{prefix}-tooz", "tooz etcd3gw (gRPC gateway /v3)"), floor]
    if target.backend == "zookeeper":
        hosts = target.raw["hosts"]
        return [ours, _kazoo_lock(target, f"{prefix}-kazoo"),
                _tooz(f"zookeeper://{hosts}?timeout=10", f"{prefix}-tooz", "tooz zookeeper"),
                floor]
    if target.backend == "postgresql":
        return [ours, _tooz(target.raw["tooz"], f"{prefix}-tooz",
                            "tooz postgresql (advisory lock)"), floor]
    return []


def _rate(peer: Peer, sizes: Sizes) -> list[float]:
    """Cycles/s of each of ``w6_windows`` windows, after 3 cycles and ``w6_warmup_s``
    seconds of unmeasured cycles."""
    cycle, close = peer.open()
    try:
        for _ in range(3):  # first use: connection, session, first keys / znodes
            cycle()
        windows = Windows(time.monotonic(), sizes.w6_warmup_s, sizes.w6_windows,
                          sizes.w6_duration_s / sizes.w6_windows)
        for _ in range(10_000_000):
            cycle()
            if not windows.record(time.monotonic()):
                break
    finally:
        close()
    return [c / windows.window_s for c in windows.counts]


def w6_peers(target: Target, sizes: Sizes, prefix: str) -> dict[str, Any]:
    """Cycles/s of ours and each peer, alternating the order between repeats; a peer
    that fails (e.g. tooz's gateway driver against this etcd) is reported with its
    error, not dropped.

    Each rate is the median of the peer's windows over every repeat, with their
    ``spread``; ``ratio_spread`` is that of window ``k`` of ours over window ``k`` of
    the peer in the same repeat."""
    peers = peers_for(target, sizes, prefix)
    if not peers:
        return {"note": f"no peer lock library is measured on {target.backend}", "peers": []}
    rates: dict[str, list[list[float]]] = {p.name: [] for p in peers}
    errors: dict[str, str] = {}
    for rep in range(sizes.w6_repeats):
        for peer in peers if rep % 2 == 0 else list(reversed(peers)):
            if peer.name in errors:
                continue
            try:
                rates[peer.name].append(_rate(peer, sizes))
            except Exception as exc:
                errors[peer.name] = f"{type(exc).__name__}: {exc}"[:400]
    ours_runs = rates[peers[0].name]
    ours_rate = median(w for run in ours_runs for w in run)
    rows = []
    for peer in peers:
        windows = [w for run in rates[peer.name] for w in run]
        rate = median(windows) if windows else None
        paired = [r for a, b in zip(ours_runs, rates[peer.name], strict=False)
                  for r in paired_ratios(a, b)]
        rows.append({
            "name": peer.name,
            "library": peer.library,
            "fencing": peer.fencing,
            "cycles_per_s": rate,
            "spread": spread(windows),
            "ours_over_peer": (ours_rate / rate) if rate else None,
            "ratio_spread": spread(paired),
            "error": errors.get(peer.name),
        })
    return {"duration_s": sizes.w6_duration_s, "repeats": sizes.w6_repeats,
            "windows": sizes.w6_windows, "warmup_s": sizes.w6_warmup_s, "peers": rows}
