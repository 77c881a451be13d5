"""etcd v3 backend: ``open_store("etcd://127.0.0.11:2379,127.0.0.12:2379/prefix")``.

A worker session is one etcd **lease**; every job it claims is an *owner key* attached
to that lease, so one keepalive renews them all and a revoked or expired lease drops
them all at once. Claim, complete, release and fail are each decided by **one
transaction** in which etcd compares the owner key (``complete_many`` decides up to 100
completions in one, ``release_many`` and ``fail_many`` up to 100 releases or failures,
``claim_next_many`` up to 100 claims, a nested transaction with its
own compares per job, and ``complete_and_claim_next`` a completion with the next claim
nested in it; a claim of a job with an attempt limit sends a second; a fail with a
retry delay grants that delay's lease first; see below); the fencing token (generation)
is ``epoch * 2**44 +`` the owner key's ``create_revision``, i.e. the claim transaction's
revision: strictly increasing per job (and across the whole cluster, but for the claims
of one ``claim_many`` or ``claim_next_many`` batch, which share its revision), not
consecutive (``consecutive_generations=False``). The store
epoch (key ``PREFIX/epoch``, 0 until ``bump_epoch`` first runs, so tokens are plain
revisions until then) is compared inside every claim transaction against the driver's
cached copy and recorded in the owner value; see :mod:`._tokens` and
:mod:`._tokens_epoch`.
``renew`` is two requests in one round trip, not one atomic step: a read-only
transaction comparing the owner key, and one keepalive of the session's lease sent while
it is under way (the comparison's verdict is raised first).
Each claim returns its own state as ``ClaimResult.handle`` (an :class:`EtcdClaim`: the
exact owner value written, the job's work queue, the attempt and the attempt limit),
which the lease hands back with renew, complete, release and fail; the driver keeps no
table of claims. Without it (a claim this process did not make) the compare is on the
owner key's lease instead of its value, and completing, releasing or failing first
reads the job's queue marker and owner key (failing also its attempts and limit).

URL and options (query string or keyword arguments of ``open_store``; keyword
arguments win; names and value rules shared with the other backends, see
:mod:`consensus_lease.options`; anything else, a name given twice in the query string or
an old name such as ``ca_cert`` is ``InvalidArgument``):

=====================  ===================  ===============================================
option                 default              meaning
=====================  ===================  ===============================================
hosts                  (required)           ``h1:port,h2:port,...`` members tried in order
                                            on failure; port defaults to 2379
``/prefix``            ``/consensus_lease`` key prefix; every key lives under
                                            ``PREFIX/``. Prefixes must not nest.
``timeout_s``          5.0                  deadline of one gRPC request, seconds
                                            (a keepalive waits at most
                                            ``min(timeout_s, 2/3 TTL)``, moves on at once
                                            from a broken stream and hedges on the next
                                            member after ``max(0.15, TTL/20)`` of
                                            silence; see :mod:`._transport_keepalive`)
``connect_timeout_s``  10.0                 how long to keep trying members (connect,
                                            fail over, read back after a lost answer)
                                            before ``BackendUnavailable`` /
                                            ``OutcomeUnknown``, seconds. ``get``,
                                            ``records``, ``queue_jobs``,
                                            ``queue_candidates``, ``queue_stats``,
                                            ``upgrade_queue`` and ``purge`` end, all
                                            their pages included, by
                                            ``max(timeout_s, connect_timeout_s)``
``user``, ``password`` none                 etcd RBAC credentials (also as
                                            ``etcd://user:password@hosts/...``; options
                                            win); needs read/write on the prefix
``ca_file``            none                 PEM CA file: use TLS to every member
``cert_file``,         none                 PEM client certificate and key files for TLS
``key_file``                                client-certificate auth (both or neither;
                                            they need ``ca_file``)
=====================  ===================  ===============================================

Renamed: ``ca_cert`` -> ``ca_file``, ``cert_cert`` -> ``cert_file``, ``cert_key`` ->
``key_file``. TLS files must exist when the store is opened.

Keys (see :mod:`._layout`): ``PREFIX/epoch`` the store epoch, ``PREFIX/HEX/o`` owner
(leased), ``PREFIX/HEX/h`` history, ``PREFIX/HEX/c`` completion record, ``PREFIX/HEX/q``
queue marker, ``PREFIX/HEX/a`` attempts, ``PREFIX/HEX/e`` last error, ``PREFIX/HEX/f``
FAILED record, ``PREFIX/HEX/l`` attempt limit, ``PREFIX/HEX/n`` not-before (on a lease
of its own), ``PREFIX/HEX/v`` value (``set_value``; on the holder's lease), where ``HEX``
is the hex of the job id's UTF-8 bytes, so no id can collide with another or escape the
prefix.

Leader elections (``Capabilities.elections``; see :mod:`consensus_lease._election`) are
leases on the same keys under ``PREFIX/elections/NHEX/`` (``NHEX``: hex of the election
name), claimed, renewed and released by the same transactions; the leader's value is
the value key, put by one transaction comparing ownership as renew does (see
:mod:`._jobs_value`) and deleted by the release. Elections are left out of ``records`` and
cannot be enqueued; a subscription to one is woken by every change (a new leader, its
value, its end), which observers follow.

Work queues (see :mod:`._queues`, :mod:`._queues_index`): ``PREFIX/q/QHEX/j/HEX`` member
key (value: the payload; its create revision is the job's ``seq``),
``PREFIX/q/QHEX/p/HEX`` pending key (value: the job's ordinal; deleted by the completion
transaction and by the one making the job FAILED, put back by requeue with a new
ordinal) and index entry ``PREFIX/q/QHEX/i/ORD/HEX`` (``ORD``: 20-digit ordinal, so key
order is FIFO order), ``QHEX`` the hex of the queue name. Ordinals come from the counter
``PREFIX/q/QHEX/k/seq``, compared and advanced by each enqueue (one transaction per
chunk of up to 100 jobs: ``enqueue_many``) and requeue. ``claim_next`` scans the index
from the driver's cursor (where its last scan found a candidate) or the low-water mark,
in key-ordered ranges spanning at most 1,024 ordinals (etcd walks its index over the
whole range it is asked for, so a range over the whole queue would cost O(depth)), then
reads the candidates' pending, owner and not-before keys and payloads, then claims with
the ordinary claim transaction, which also puts the job's held marker
``PREFIX/q/QHEX/h/HEX`` on the session's lease and reads the job's queue marker, so the
completion can delete the pending key and held marker in its own transaction. Its cost
depends on the held and delayed jobs at the front of the queue, not on its depth.
``queue_stats`` is one read of counters kept in the same transactions (see
:mod:`._queues_index`), plus a ``LeaseTimeToLive`` for each of at most 8 holders' leases
(``oldest_held_lease_until``). A queue holds at most 250,000 jobs and 256 MiB of
payloads (``max_queue_jobs``, ``QueueFull``: together under half of etcd's default 2 GB
quota). Queues written by the first layout are refused until ``upgrade_queue`` ran (the
command ``consensus-lease upgrade-queue``; :mod:`._queues_upgrade`). Waiting is a watch
(enqueues and requeues; owner keys deleted by release, fail or expiry; not-before keys
deleted by their lease's expiry). Payloads are limited to 1 MiB (``max_payload_bytes``),
under etcd's default ``--max-request-bytes`` of 1.5 MiB, with room for the keys; a
server configured lower refuses larger enqueues with ``InvalidArgument``.

``complete_many`` (``max_complete_batch`` 100; see :mod:`._jobs_complete_many`) decides
up to 100 completions in **one transaction**: it has no compares, and its ``success`` branch holds
one nested transaction (``RequestOp.request_txn``, etcd 3.3+) per item, which is the
transaction of that item's lone completion, with its own ownership compares; etcd
decides each nested transaction by its own compares, so a stale or expired item takes
its ``else`` branch (refused by the rule of ``complete``) while the others commit, in
one revision. etcd refuses a transaction that puts one key twice, also across nested
transactions, and each completion of a queued job bumps the queue's completed counter by
a put; so the item at position ``i`` of a batch puts the counter's shard
``PREFIX/q/QHEX/k/done/NNN`` (``i`` > 0; position 0 and every lone completion put
``PREFIX/q/QHEX/k/done`` itself) and ``queue_stats`` sums their versions. Queues written
before the shards existed read as before, with no upgrade step; a driver of an earlier
version counts only ``k/done`` (it shows the jobs completed at later positions of a batch
as available). A chunk is cut to etcd's ``--max-txn-ops`` (the outer list holds one
operation per item and each nested transaction is checked against the rest: 100 items
need at most 111 of the default 128; a server allowing fewer gets smaller chunks,
learnt from its first refusal) and to 1 MiB of nested transactions (under the default
``--max-request-bytes``); a claim whose handle does not know the job's queue has its
queue marker read first, for all such items in one read.

``release_many`` and ``fail_many`` (``max_end_batch`` 100) are the same protocol
(:mod:`._jobs_batch`, which ``complete_many`` uses too): one transaction per chunk, a
nested transaction per item that is the item's lone ``release`` or ``fail``
transaction, with its compares, so a stale item is refused alone while the others
apply; cut to ``--max-txn-ops`` (a release needs at most 103 operations for 100 items,
a failure 108) and 1 MiB; a lost answer settled by reading each item's owner key and
its release marker (history key) or error nonce back, the same transaction re-sent
only if every item is still held (its compares cannot pass twice). A release puts no
shared key; FAILED verdicts of one queue in one ``fail_many`` put the failed counter's
shards ``PREFIX/q/QHEX/k/failed/NNN`` by position, summed by ``queue_stats`` like the
completed counter's (a driver of an earlier version counts only ``k/failed``). The
retry delays of a ``fail_many`` call take **one lease per distinct TTL**
(``ceil(retry_in_s)``, granted before the first transaction, one ``LeaseGrant`` round
trip each) shared by the not-before keys of the items of that TTL: each job is
claimable when that lease expires, so never earlier than its ``retry_in_s`` after the
call, as with ``fail``; a lease no applied item uses is revoked. Claims without their
queue (or, for ``fail_many``, attempts and limit) have them read first, in read-only
transactions of up to 125 reads.

``claim_from_queue_many`` (``claim_next_many``, ``max_queue_claim_batch`` 100; see
:mod:`._queues_claim`) is ``claim_next``'s scan (read-only), then **one transaction**
of nested claim transactions, one per candidate (up to 100, each needing 6 operations
inside the outer list's 100: 106 of the default 128; fewer on a server allowing fewer),
under one compare of the store epoch: a candidate another claimer took since the scan
fails its own compare while the others are claimed, at one revision (one token for the
batch). If the scan was cut at ``n`` and candidates were lost, the next are read and
claimed the same way (at most 3 rounds lost to other claimers). A job with an attempt
limit fails its nested compare and is claimed on its own afterwards (two transactions);
one whose attempts are used up becomes FAILED, and a round that made jobs FAILED is
followed by another without counting as one of the 3, so any number of exhausted jobs
at the queue's head is walked past (``[]`` means nothing was claimable). A lost answer
is settled by reading the owner keys back (the batch's nonce).

``complete_and_claim_next`` (``fused_claim_next``; see :mod:`._queues_fused`) is **one
transaction**: the lone completion's, with the claim of one candidate of the queue
nested in its ``success`` branch, so it runs only if the completion's compares pass (a
refused completion claims nothing) and is decided by its own compares (a candidate
taken meanwhile leaves the completion to commit alone). The two share no key: the claim
puts no queue counter. The candidate is one the driver's last scan of the queue offered
(less than a second ago) that no claim of this driver took since, a random one of the
oldest 8; with none left a scan runs first (read-only). So a worker draining a queue
pays one round trip per job, plus a scan per 32 jobs (or per second). When the nested
claim does not apply, or the queue has nothing to offer, the next job is claimed as
``claim_next`` claims it, after the completion (at most 3 lone claims that find the job
held or delayed; one that makes an exhausted job FAILED does not count, so any number
of them is walked past, two transactions each; an error there is not raised: no next
job). A lost answer is settled by reading back the completed job's owner and
completion keys and the candidate's owner key (this request's nonce).

Job lifecycle (attempts, ``fail``, retry delays, FAILED, ``requeue``; see
:mod:`._jobs_attempts` and :mod:`._jobs_fail`):

* ``attempt``: every claim transaction also puts the attempts key ``a`` (value: the
  claim's epoch, empty for epoch 0); etcd adds 1 to a key's ``version`` on every put, so
  the version is the number of claims, counted by the store in the claim's own
  transaction (the put answers the previous version: no read). Its ``mod_revision`` is
  the last claim's revision (its generation below the epoch bits).
* ``max_attempts`` is the limit key ``l`` (``{max_attempts, base}``), written by
  ``enqueue``. The common claim compares ``l`` absent, so jobs without a limit pay
  nothing but a compare and a put; a job with one is claimed in two round trips: the
  first transaction's ``else`` branch answers the job's keys, the second compares
  ``mod_revision(l)`` and ``version(a)`` as read, and either claims or, if
  ``version(a) - base >= max_attempts`` (the last attempt ended without completion or
  fail), puts the FAILED record ``f`` and deletes the pending key: ``JobFailed``.
* ``fail`` is one transaction comparing as release: delete ``o``, put the release
  marker in ``h`` and the error in ``e``; then either the FAILED record ``f`` (attempts
  used up; the pending key deleted) or, for ``retry_in_s > 0``, the not-before key ``n``
  attached to a lease of its own of ``ceil(retry_in_s)`` whole seconds (at least 1;
  etcd raises it to its minimum TTL, 2 s by default), granted just before. Claims
  compare ``n`` absent; etcd deletes it when the lease runs out (within about 0.5 s of
  the TTL; a new leader extends leases), which wakes waiting claims. ``not_before`` in
  records is local wall clock + the lease's remaining TTL (display only). Without a
  delay (``retry_in_s == 0``) or when the job becomes FAILED, no lease is granted.
* The record a completion returns (attempt, last error, limit) comes from the claim's
  handle, which knows the attempt and the limit (neither changes while the job is
  held); the completion transaction also gets ``e`` unless the claim was the job's
  first attempt and the job has no limit (an earlier attempt may have failed), and
  ``a``, ``e`` and ``l`` for a claim without its handle: reads in the same round trip.
* A FAILED job has ``f``, which every claim's compares refuse (the common claim through
  ``l``, which a FAILED job always has), and no pending key, so no candidate list
  offers it. ``requeue`` is one transaction comparing ``mod_revision(f)``: delete ``f``,
  rewrite ``l`` with ``base`` = the attempts so far, put the pending key back (with the
  queue's next ordinal, compared: the job goes to the back).

etcd guarantees relied on (etcd 3.4 docs):

* Transactions are atomic and serializable; every write is linearizable, and a
  transaction's writes share one revision, which only ever grows
  (https://etcd.io/docs/v3.4/learning/api_guarantees/,
  https://etcd.io/docs/v3.4/learning/api/#transaction). Hence one winner per claim and
  a strictly increasing token.
* ``create_revision`` of a key is the revision that created it and changes only when
  the key is deleted and created again (https://etcd.io/docs/v3.4/learning/data_model/).
  Hence ``create_revision == generation`` names exactly one claim. A key's ``version``
  is the number of puts since it was created (same page), hence the attempt count.
* A lease's TTL runs on the leader; when it ends, etcd deletes every key attached, in
  one revision; a keepalive on a lease that is gone answers TTL 0; etcd grants at
  least its minimum TTL (1.5 x election timeout, 2 s by default) and a new leader only
  ever extends leases (https://etcd.io/docs/v3.4/learning/api/#lease-api).
* Linearizable reads (the default) reflect every write that completed before them.
* A watch from revision ``r`` delivers every later event in order, none skipped
  (https://etcd.io/docs/v3.4/learning/api/#watch-api), so ``wait_for_change`` learns of
  a takeover when etcd deletes the key, not at the next poll.

Lost answers: writes are never re-sent blindly. After a timeout or a member failure
mid-request the driver reads the job's keys back; each write is recognisable afterwards
(a claim by the nonce in its owner value (a batch's claims share one), a completion by
its record (a batch of completions lands whole or not at all: any item still held by its
claim means not applied; a fused completion and claim likewise, the claim told by its
nonce), a release by its
history marker, a fail by the nonce in its error record, a claim that made the job
FAILED by the FAILED record, a requeue by the nonce in its limit record, an enqueue by
the nonce in its queue marker) and guarded by a compare its own success makes false, so
re-sending it after "not applied yet" cannot apply it twice. ``OutcomeUnknown`` only when
reading back fails within ``connect_timeout_s``. Idempotent reads are retried over the
members with ``tenacity`` for at most ``connect_timeout_s``, and so are the few writes
that may land twice unharmed (the regression marker's compare-and-set, the ordinal
writes of ``upgrade_queue``). A ``LeaseGrant`` (session, retry delay) whose answer is
lost is retried; the orphan lease holds no key and expires.

Restores (see :mod:`._tokens_history`): etcd's revisions only grow, so an answer
whose header revision is below one already seen (KV requests, lease grants and revokes
are linearizable: each is compared with what was seen before it was sent) or that names
another ``cluster_id`` means the cluster's history went back: it was restored from an
older snapshot, or wiped. Tokens handed out from then on could be lower than tokens
already used, so every session open at that moment is over (``SessionEvent.REGRESSED``;
each later operation on it raises ``StoreRegressed``), and a claim answered from that
history is handed back (its owner key deleted) and raises ``StoreRegressed``. Keepalive
answers are not linearizable: one below the revision seen is confirmed with a
linearizable read, so an idle worker learns of a restore at its next keepalive. After a
restore, run ``bump-epoch --above HIGHEST`` before restarting the workers: every token
is then above every earlier one.

Limitation: a claim whose answer was lost and that is still in flight when read back
may land later; it then holds the job under this session until this session claims the
job again (it is adopted: the session remembers the nonces of its unsettled claims, its
only per-claim state) or the session ends.
"""

from __future__ import annotations

from ..._extras import needs_extra

try:
    from .driver import EtcdBackend, EtcdClaim, EtcdSession
except ModuleNotFoundError as exc:  # the extra is not installed
    raise needs_extra(exc, "etcd", "the etcd backend") from exc

__all__ = ["EtcdBackend", "EtcdClaim", "EtcdSession"]
