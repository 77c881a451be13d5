"""Sharding jobs across stores: which store (shard) a queue or a job lives on.

One etcd cluster or ZooKeeper ensemble carries a bounded write rate (docs/capacity.md
says where it saturates). Past that, split the work over several independent stores —
separate clusters, or separate key prefixes / chroots when only the data size is the
problem — and route every queue (or job) to one of them with :func:`shard_for`::

    from consensus_lease import open_store
    from consensus_lease.shard import shard_for

    SHARDS = ["etcd://etcd-a1:2379,etcd-a2:2379,etcd-a3:2379/jobs",
              "etcd://etcd-b1:2379,etcd-b2:2379,etcd-b3:2379/jobs"]
    stores = {url: open_store(url) for url in SHARDS}
    stores[shard_for("invoices", SHARDS)].enqueue("invoices", "inv-42", b"...")

The rules:

* **One URL per shard** (a URL may name several members of the same cluster; that is
  still one shard). The URL *string* is the shard's identity in the hash: write it
  the same way in every process, and in the same list of shards; changing how a
  shard's URL is written moves its keys as if it were a new shard.
* **The key is the queue name for work queues**: every job of a queue lives on one
  shard, so ``claim_next``, ``queue_stats`` and ``purge`` see the whole queue. For
  named jobs (``session.claim(job_id)``) the key is the job id.
* **Rendezvous (highest-random-weight) hashing**: each (shard URL, key) pair gets a
  64-bit weight from BLAKE2b, and the key goes to the shard with the highest weight. The
  answer depends only on the key and the set of URLs (not their order, not Python's
  per-process salted ``hash()``), so every producer and worker agrees without talking
  to each other; adding a shard to N moves only the ~1/(N+1) of keys that the new shard
  now wins, and removing one moves only that shard's keys.
* Moving a key is not free: jobs already enqueued on the old shard stay there.
  Before changing the list, drain the queues that move (or keep a worker on the old
  shard until they are empty).

Why one :class:`~consensus_lease.Session` does not span shards — each shard is its own
store, and nothing the library guarantees carries across two of them:

* **Liveness is per store.** A session is an etcd lease or a ZooKeeper session of *one*
  cluster, kept alive by that cluster. A worker can lose its session on shard A (a
  partition, an expiry) while its session on shard B stays healthy; a spanning session
  would have to call itself lost whenever any shard's is (losing every job for one
  shard's trouble) or keep jobs whose store no longer vouches for them (unsafe).
  So a worker opens one session per shard it serves, and each session's state
  (``SessionState``, ``LeaseLost``) speaks for that shard's jobs only.
* **Fencing tokens of different shards are not comparable.** A token is ordered only
  against other tokens *of the same job on the same store*: on etcd it is the owner
  key's create revision (each cluster counts its own revisions), on ZooKeeper the job
  znode's version, on SQLite the job row's generation, each with that store's own
  epoch above it. A destination that fences
  effects by job must key its fence by ``(shard, job_id)`` — e.g. ``SqliteFence``
  with the job id written as ``f"{shard_name}/{job_id}"`` — or make job ids unique
  across shards (which routing by queue name gives only if queue names are unique and
  job ids carry the queue). Otherwise a high token from shard A could make a
  destination reject the rightful holder's lower token from shard B.
* **No atomic step spans two stores.** ``claim_many``, ``enqueue_many`` and every
  compare the library makes are one transaction of one store; there is no cross-shard
  transaction, so a batch must be split by shard first (each part atomic on its own).

Rebalancing keys between live shards, a cross-shard ``claim_next`` and a registry of
shards are out of scope: the list of URLs is configuration the operator owns.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from .errors import InvalidArgument
from .options import redact_url

__all__ = ["shard_for"]

_DIGEST_BYTES = 8


def _weight(url: bytes, key: bytes) -> int:
    """The rendezvous weight of ``key`` on the shard ``url``: 64 bits of BLAKE2b over
    the length-prefixed URL and the key (so no two (url, key) pairs share an input)."""
    digest = hashlib.blake2b(len(url).to_bytes(4, "big") + url + key,
                             digest_size=_DIGEST_BYTES).digest()
    return int.from_bytes(digest, "big")


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _check_urls(urls: Sequence[str]) -> list[str]:
    if isinstance(urls, (str, bytes)) or not isinstance(urls, Sequence):
        raise InvalidArgument(
            f"urls must be a sequence of store URLs (one per shard), not "
            f"{type(urls).__name__}"
        )
    checked = list(urls)
    if not checked:
        raise InvalidArgument("urls is empty: give at least one shard's store URL")
    for url in checked:
        if not isinstance(url, str) or not url.strip():
            raise InvalidArgument(f"each shard URL must be a non-empty str, not {url!r}")
    if len(set(checked)) != len(checked):
        twice = sorted({u for u in checked if checked.count(u) > 1})
        raise InvalidArgument(f"a shard URL is listed twice: {redact_url(twice[0])!r}")
    return checked


def shard_for(key: str, urls: Sequence[str]) -> str:
    """The store URL, among ``urls``, that ``key`` lives on (rendezvous hashing).

    Pure and deterministic: the same key and the same set of URLs give the same URL in
    every process and on every machine (order of ``urls`` does not matter); no store
    is contacted.

    Args:
        key: what is routed: a queue name (all of a queue's jobs on one shard) or a job
            id (named jobs); a non-empty ``str``.
        urls: one store URL per shard, each a non-empty ``str``, no duplicates. The URL
            string is the shard's identity (see the module docstring).

    Returns:
        ``str``: the element of ``urls`` with the highest weight for ``key``.

    Raises:
        InvalidArgument: ``key`` is not a non-empty ``str``; ``urls`` is empty, a bare
            string, not a sequence, holds a non-``str`` or empty URL, or lists a URL
            twice. Nothing is changed (there is nothing to change).
    """
    if not isinstance(key, str) or not key:
        raise InvalidArgument(f"key must be a non-empty str (a queue name or job id), "
                              f"not {key!r}")
    checked = _check_urls(urls)
    raw = _encode(key)
    return max(checked, key=lambda url: (_weight(_encode(url), raw), url))
