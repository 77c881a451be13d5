"""ZooKeeper backend: ``zk://host:port[,host:port...]/chroot`` (also ``zookeeper://``).

::

    store = open_store("zk://127.0.0.21:2181,127.0.0.22:2181,127.0.0.23:2181/jobs-prod",
                       user="svc", password="...", connect_timeout_s=5)

How leases map onto ZooKeeper
-----------------------------
* A worker session is one ZooKeeper session, on its own kazoo client. Its TTL is the
  session timeout the server *negotiated* (clamped to [minSessionTimeout,
  maxSessionTimeout], by default 2-20 x tickTime): ``granted_ttl_s`` reports it and the
  local deadline uses it. ``keepalive()`` is one write barrier on the session's
  connection (a multi of one ``check``, changing nothing: see ``get`` below).
* Each job is a persistent znode ``{chroot}/jobs/{percent-encoded id}`` whose **version is
  the generation** (fencing token; with a store epoch above 0, its low 32 bits: see
  "Store epoch" below). A claim is one multi: ``set_data`` at the version just
  read (or ``create`` + ``set_data`` the first time) and ``create`` of the EPHEMERAL owner
  znode ``.../owner`` (owner label, session id, a nonce per claim). Tokens are consecutive.
  The read is skipped where the backend knows the answer (``_jobs_known``): a job it never
  saw is claimed as a new one, a job it released at the version it left it; the multi's
  versioned operations are the compare, and only a multi that fails is followed by the
  read (and a second multi). So a claim+complete cycle of a new job, or claim+release of
  a job released here, is two multis and nothing else.
* Completion is one multi: ``set_data`` of the completion record (result bytes and the
  generation that completed it) at version == generation, and ``delete`` of the owner
  znode. It bumps the version, so a claim prepared against the held state fails.
  Release is one multi: ``check`` version == generation and ``delete`` of the owner znode.
  Neither reads first: a claim returns what it made (generation, owner znode and its
  version, a queued job's markers) as its ``ClaimResult.handle``, the core hands it back
  with the lease's complete or release, and the multi is sent at once; the store checks
  generation and holder in it (the versioned ``set_data``/``check`` fails after any
  other claim or completion, the versioned ``delete`` once the owner znode is gone, e.g.
  with the session). Together they are exactly "this session holds the job at this
  generation": while the version is the generation, the owner znode can only be the one
  this session's claim created with it (only a claim multi creates an owner znode, it
  bumps the version in the same transaction, and it fails while one exists). A claim
  without such a handle (``handle`` ``None``: not made by
  this process) is read first (owner znode's ``ephemeralOwner``, after a ``sync``) and
  written only if this session holds the job at that generation. A failed multi is
  followed by the same read, to say why, and to recognise a retry of this session's own
  completion. No table of claims is kept per session (only claims whose outcome is
  unknown, until settled: see below).
* ``renew`` with the claim's handle is one multi of two ``check``s (job znode at version
  == generation, owner znode at the hold's version), a write that changes nothing;
  without it, or if that fails, it reads, after a write barrier, the job znode (version,
  epoch) and the owner znode's ``ephemeralOwner`` in one pipelined round trip (and, if
  that shows the job not held, reads once more, after a ``sync``, to say why).
* Connection states reach the core as session events: kazoo SUSPENDED -> SUSPENDED,
  CONNECTED again with the same session -> RECONNECTED, LOST -> EXPIRED. An expired
  session's client is never reused (kazoo would open a new session on it).
* kazoo pings on its own, so a ZooKeeper session does not lapse when the worker stops
  renewing: it lives as long as its process. The core ends it: when a session's local
  deadline passes without a successful renewal (or it is lost otherwise) the core calls
  ``close_session``, which closes the ZooKeeper session, and the server deletes its
  owner znodes at once. A handle used without the core's ``Session`` lives until
  ``close_session`` or ``close``.
* A lost answer to a multi is settled by reading back after reconnecting (owner znode's
  nonce and ephemeralOwner, completion record): never re-sent blindly, no orphaned owner
  znode, no double version bump. ``OutcomeUnknown`` only if reading back fails in time;
  such a claim stays on the session handle (``uncertain``) until a later claim of the
  job adopts it or ``keepalive`` releases it.
* ``get``/``records``/``wait_for_change`` use one shared client (a session of its own),
  which ``open_store`` starts: like etcd's, the store connects when opened, within
  ``connect_timeout_s``, else ``BackendUnavailable``. ``wait_for_change`` waits on a
  watch on the owner znode. ``lease_until`` is always ``None``: ZooKeeper does not
  expose when a session will expire.
* ``get`` and ``records`` read after a write barrier on the shared client (a multi of one
  ``check`` of ``{chroot}/jobs`` at any version: it changes nothing, costs one quorum
  write): they see every claim, release or completion completed before the call. A
  ``sync`` is not enough on a client connected to the leader, which answers it at once —
  possibly before it has applied a write its followers already applied and answered, or
  while it is deposed and does not know it yet.
* Nothing but the job znodes (and ``{chroot}/jobs``, ``epoch``, ``identity``) stays
  behind: owner znodes go with release, completion or the session (a job that ever
  failed also keeps its failure znode, below). Never delete job znodes by hand: their
  version is the generation history, and a re-created znode would start again at 0.

Store epoch and history regression (``capabilities.epoch``; ``_tokens``, ``_tokens_history``)
-------------------------------------------------------------------------------------
* A wiped ensemble (or one restored from an older backup) starts its znode versions
  again, so its tokens would go back: the fence would reject the honest next holder and
  could accept a paused old one. The **store epoch** moves tokens on again: every token
  is ``epoch * 2**32 + the job znode's version`` (``epoch_shift`` 32: a version is a
  signed 32-bit int), with the epoch held in ``{chroot}/epoch`` (made at 0 when a backend
  first opens a session on the store; a store never bumped keeps every token as it was).
* Every claim multi begins with ``check({chroot}/epoch, version=V)``, ``V`` and the epoch
  cached per backend (read when a session opens): no extra round trip. The claim writes
  the epoch into the job znode's data with the attempt, so records, completions and
  errors give the same token later. A multi that failed on that check alone is sent
  once more after reading the epoch again. Renew, complete, release and fail compare the
  version with the token's low 32 bits; without a hold, the epoch the claim recorded too.
* ``bump_epoch(above)`` sets the epoch to ``max(epoch + 1, above // 2**32 + 1)``: read
  after a write barrier, then one versioned ``set_data`` (``create`` if absent) on the
  shared client, read back through its nonce if its answer is lost, read and sent again
  if another bump came first. Run it (``consensus-lease bump-epoch --above
  HIGHEST``) after a wipe or restore, with the workers stopped.
* **Noticing a regression** (details in ``_tokens_history``): the backend keeps the highest zxid
  any of its clients was answered with, and the store's identity ``{chroot}/identity``
  (a random id made with the epoch znode), read when a session opens, in the keepalive
  round trip at most once per keepalive interval, and after a reconnect. A write
  answered below a zxid seen before it was sent, the identity gone or changed, or the
  epoch gone back means the history went back. ZooKeeper refuses a client that has seen
  newer zxids than it has, which after a wipe keeps every client of the backend
  reconnecting in vain: so while a session stays disconnected (from 1 s, or half its
  keepalive interval), the backend probes the store with a fresh client every 2 s (or
  half the keepalive interval) and compares its identity and zxid; an expiry ZooKeeper
  reports is probed for too before it is passed on. Then every session of the backend
  ends with ``StoreRegressed`` (reported to the core as an expiry, raised by every later
  call) and its client is stopped, handing its jobs back; opening a session raises
  ``StoreRegressed`` until the epoch has been raised (here or in another process).

Job lifecycle: attempts, ``fail``, retry delays, FAILED, ``requeue`` (``_jobs_lifecycle``)
-------------------------------------------------------------------------------------
* ``attempt`` is in the job znode's data: each claim's versioned ``set_data`` writes the
  attempt read + 1 (named, batch and queue claims alike), and the completion record
  keeps it. ``max_attempts`` is written into the job znode by ``enqueue`` (version 0)
  and carried by every claim; a job never enqueued has none.
* Everything else lives in the persistent **failure znode** ``{job}/failure``, made by the
  job's first ``fail()``: the last error, the FAILED flag, the generation it was written
  at, the retry delay and the attempt base (``requeue`` sets it to the attempt then; the
  budget is ``attempt - base < max_attempts``), and a nonce. It is always written at the
  version read, and **never bumps the job znode's version**: claims alone (and a
  completion) move the generation, so generations stay consecutive and a claim's token
  is still the job znode's version.
* ``fail()`` is one multi with the checks of a release: ``check`` of the job znode at
  version == generation, ``delete`` of the owner znode at the claim's version, the
  failure znode's versioned ``set_data`` (``create`` + ``set_data`` the first time), and
  for a queued job the held marker's delete, plus the open marker's delete if the job
  becomes FAILED (so ``queue_candidates`` never offers it) or the creation of the
  persistent **delayed marker** ``{q}/delayed/{member}`` for a retry delay (a retrying
  job stays open). Sent from the claim's hold without reading, as completion is; whether
  the attempt was the last is decided from what the claim read (attempt, limit, base),
  which nobody else can change while the job is held.
* **The retry delay is on the store's clock.** ZooKeeper has no call that reads its
  clock, but every write's ``Stat.mtime`` is the time the leader ordered it (whole ms),
  applied unchanged by every member. The delay runs from the failure znode's mtime (the
  ``fail()`` write itself). A claim that finds a delay recorded since the job's last
  claim (failure znode's generation == the job znode's version) first writes
  ``{chroot}/jobs`` (``set_data``, any version; its data is unused) and claims only if
  that write's mtime is past the failure znode's mtime + the delay; the claim multi,
  sent after that answer, lands later still, and it deletes the delayed marker. A
  worker's clock never takes part (it only times how long a waiter sleeps: a wall clock
  an hour off changes nothing). That write costs one more round trip, only for a job
  whose delay was recorded and not yet claimed past. ``LeaseRecord.not_before`` is the
  failure znode's mtime + the delay, shown until the next claim (even once passed:
  telling would take a write). TTL znodes (``extendedTypesEnabled``) could expire a
  marker on the server's clock, but they are off by default, so they are not used.
* A claim that finds the job unheld with its attempts used up (its last lease expired
  or was released) does not claim: one multi (``check`` of the version read, the failure
  znode's versioned write with FAILED and the last error, or "attempts exhausted:
  attempt N ended without completion", and the open marker's delete) makes it FAILED,
  and the claim raises ``JobFailed``, as it does for any FAILED job. ``claim_many``
  yields ``None`` for both.
* ``requeue`` (shared client): read after a write barrier, then one multi: the failure
  znode at its version (not FAILED, no delay, base = attempt, error kept), a ``check``
  of the job znode's version, and the open marker made again. Not FAILED (or unknown):
  ``InvalidArgument``.
* Lost answers of all three multis are read back (the failure znode's nonce, after a
  write barrier), never re-sent blindly; not applied, they are sent again after the
  usual read (``fail``), or the job is read again (the claim, ``requeue``).
* Waiting: ZooKeeper has no timer event. ``wait_for_change`` on a job whose claim by this
  backend was refused for a running delay sleeps until that delay ends (as measured
  from the store's clock by that claim); ``queue_candidates`` leaves out delayed
  members whose delay is running, timing the delays it has not seen with one round trip
  (the markers, plus a write of ``{chroot}/jobs`` for the store's "now"), and
  ``wait_for_queue``, when every job not held has a delay running, sleeps until the
  soonest ends (also woken by a child watch on ``delayed``). A waiter thus wakes once
  per delay, not in a loop.
* Waiting claims subscribe (``subscribe_job``/``subscribe_queue``, see ``_watches_subscribe``):
  watches on the shared client (the job's owner znode; the ``open``, ``held``,
  ``delayed`` children of the queue's oldest buckets not done), one per znode however
  many wait, re-armed asynchronously after each event; retry delay ends and re-checks
  run on one timer thread. No thread and no polling per waiting claim. An event on a
  queue's ``open`` (most often an enqueue) wakes its longest-waiting claim at once, as
  the round re-arming the watch is sent; once subscribed, a waiting claim lists the
  queue without the ``sync`` (``queue_candidates_after_wake``): the watches, armed
  ahead of the listing on the same client, tell it of anything newer. Neither touches
  the claim itself (a versioned multi, as always).
* ``get``/``records``/``queue_jobs`` read the failure znode with the job (same round
  trip): state FAILED, ``attempt``, ``error``, ``not_before``, ``max_attempts``.
  ``purge`` deletes a completed job's failure znode with it.

Work queues (``capabilities.queues``; layout in ``_layout``, operations in ``_queues``)
-------------------------------------------------------------------------------------
* Layout 2, bucketed (``_layout``): a queue's head ``{chroot}/queues/{q}`` holds the last
  seq issued and the counts of jobs and payload bytes; its jobs live in buckets
  ``{q}/b/{k}`` of 256 seqs each, with ``jobs`` (members, holding the payloads),
  ``open``, ``held``, ``delayed`` and ``failed`` markers per bucket. No listing ever
  covers more than one bucket (at most 256 names, ~200 KB with the longest ids), and
  none covers a whole queue.
* ``enqueue``/``enqueue_many`` (``capabilities.max_enqueue_batch`` = 128): one multi on
  the backend's shared client per up to 128 jobs (and at most 160 KB: every server keeps
  its last 500 writes whole in its committed log): the head written at the version read
  (which issues the seqs, FIFO, and keeps the counts exact), each new bucket's znodes,
  and per job its job znode (version 0, as a never-claimed job: the first claim makes
  generation 1), a ``queue`` tag under it (queue, bucket, member name, a nonce), the
  member ``{q}/b/{k}/jobs/{seq:010d}-{name}`` holding the payload and the open marker
  ``{q}/b/{k}/open/{seq:010d}-{name}``. Atomic per multi. If a job exists its tag
  decides: this queue -> ``False``, anything else -> ``InvalidArgument``. A lost answer
  is read back through the tags' nonce, never re-sent blindly.
* Capacity (``capabilities.max_queue_jobs``): 25,000 jobs and 16 MiB of payloads per
  queue (until purged), checked from the head before anything is sent (``QueueFull``):
  ~3 KB of every server's heap per job; measured to keep a 256 MB-heap server with the
  default jute.maxbuffer serving. More: purge, or shard queues across ensembles.
* Store-wide capacity (options ``store_max_jobs``, default 30,000, and
  ``store_max_bytes``, default 16 MiB): every job of the store (queued or named, until
  purged: the ``numChildren`` of ``{chroot}/jobs``) and the payload bytes of all its
  queues (the sum of the queue heads), read before each enqueue multi (one pipelined
  round trip of reads for up to 64 queues; one more per further 64, after a queue was
  made or deleted, or for rotated heads; ``QueueFull`` naming the option, nothing
  sent). Size them with the heap: heap needed ~ 16 MB + 3.5 x 500 x W + 2.5 x
  (store_max_jobs x 3 KB + store_max_bytes), W the largest transaction written in bulk
  (160 KB for ``enqueue_many``'s multis), measured in ``docs/capacity.md``. Stores
  (chroots) sharing one ensemble share its heap: their limits together must fit it.
* Claim, renew, release and completion of a queued job are those of any job, plus its
  markers (named by its tag): the claim multi also creates the EPHEMERAL held marker
  (same session as the owner znode, so it goes with the session too), release and
  completion delete it, and completion also deletes the open marker; FAILED moves it from
  ``open`` to ``failed``, ``requeue`` back. Claimable = children of ``open`` - children
  of ``held`` - children of ``delayed`` whose retry delay runs (see the job lifecycle
  above). ``queue_candidates`` is one round trip reading the head and the oldest bucket
  not known to be done (three listings; newer buckets only while it lacks candidates),
  plus payloads not yet cached and delays not yet timed: its cost does not grow with the
  queue's depth. Done buckets (full, no open or failed marker) are remembered and never
  read again. Ordering: oldest seq first across buckets; a claim takes one of the 8
  oldest looking claimable (see ``_queues``).
* ``claim_from_queue_many`` (``claim_next_many``; ``capabilities.max_queue_claim_batch``
  = 128; ``_queues_claim``): the candidates (``queue_candidates``, ``n`` of them), one
  pipelined read of their job znodes and tags (a job znode with another child than its
  tag, an owner or failure znode, is read in full in one more round trip), then **one
  claim multi** for the batch: the epoch check and each job's claim operations, as a
  ``claim_many`` (split to stay far below jute.maxbuffer). A multi is all or nothing: a
  candidate taken between the read and the multi fails it whole, its per-operation
  results name the failing job, which is read again, and the others (rolled back) are
  sent again (at most 8 rounds); the queue is then listed again, at most 3 times in all,
  while others took candidates and fewer than ``n`` were claimed. Oldest seq first. A
  candidate whose attempts are used up is made FAILED (one multi each) and a listing
  that made one FAILED is not one of the 3: any number of exhausted jobs at the head is
  walked past, and fewer than ``n`` means no more were claimable.
* ``complete_and_claim_next`` (``capabilities.fused_claim_next``; ``_queues_claim``): one
  multi of the completion's operations (sent from the claim's hold, as ``complete``)
  followed by the claim operations of one job **read ahead**: a random one of the 8
  oldest of the last 16 candidates this backend listed and read (kept 1 s, each used
  once). The claim's versioned ``set_data`` (the version read) and ``create`` of the
  owner znode are its compare, so a stale read only fails the multi, writing nothing.
  If it fails on the claim's operations (another worker took the job, or the epoch was
  bumped), the completion is sent alone and the next job claimed as a batch of one
  (what was read ahead is dropped); if it fails on the completion's, the completion is
  refused as ``complete`` refuses it (read after a ``sync``: ``StaleLeaseError`` or
  ``SessionExpired``, or a marker deleted by hand sent again without it) and nothing is
  claimed. A lost answer is read back through the completion record's nonce (the multi
  applied whole or neither part): applied, the job read ahead is this session's; not
  applied, as a failed multi; unknown, ``OutcomeUnknown``, the claim kept as one of
  unknown outcome (adopted by a later claim or handed back by keepalive). Not fused: a
  claim without its hold (``complete`` reads first), a result over 512 KiB (with the
  claim it could pass jute.maxbuffer), a version out of range (the multi's version
  guard refuses it before sending), and a queue with nothing to read ahead (the
  completion alone; then a batch claim of one if the listing had candidates the read
  could not plan: held, exhausted or in a retry delay; it makes the exhausted ones
  FAILED and walks past them, as above).
* ``queue_stats``: O(1): the head's count of jobs plus the ``numChildren`` of the
  queue's three tallies ``{q}/tally/held`` (ephemeral entries made and deleted with the
  held markers), ``done`` (made by completions) and ``failed``, one round trip, no
  listing; not a snapshot (see ``ZooKeeperBackend.queue_stats``).
* ``wait_for_queue`` and ``subscribe_queue`` watch the ``open``, ``held`` and
  ``delayed`` children of the buckets from the oldest not done (up to 8), and the
  creation of the next bucket, shared by every waiter.
* ``purge`` deletes each completed job's tag, failure znode, job znode (at its completed
  version) and member, up to 100 jobs per multi, with the head's counts lowered in the
  same multi. **A purged job id must not be enqueued (or claimed) again**: its job znode
  would be made anew at version 0 and its generations (fencing tokens) would repeat.
  Buckets stay (six znodes per 256 seqs).
* Queues written before layout 2 (empty head data, flat ``open``/``held``) are refused
  by queue operations with ``LegacyQueueLayout`` (an ``UnsupportedOperation``) naming
  the upgrade step: drain and purge with the previous release, delete the queue's
  znode, enqueue again. Their jobs still claim, complete, release, fail and requeue by
  name.
* ``max_payload_bytes`` is 1,000,000: ZooKeeper refuses requests over ``jute.maxbuffer``
  (0xfffff, 1 MiB - 1, by default) and the enqueue multi also carries the head, four
  paths, the tag, ACLs and framing (up to ~10 KB with the longest names). The backend also checks
  the whole request's estimated size before sending (a very long chroot). A server
  configured with a smaller ``jute.maxbuffer`` closes the connection on a too large
  enqueue: after reading back, ``BackendUnavailable`` within ``timeout_s``.

Leader elections (``capabilities.elections``; ``_layout``, ``set_value`` in ``_jobs_value``)
-------------------------------------------------------------------------------------------
* An election is a job that is never completed, under a key of its own
  (:func:`consensus_lease._election.election_key`): its job znode is
  ``{chroot}/elections/{encoded name}`` instead of ``{chroot}/jobs/...``, so elections never
  show up in ``records()`` and cannot be enqueued (``InvalidArgument``). Claim, renew,
  release, expiry and the fencing token (the job znode's version) are exactly a job's;
  the first claim of an election on a store also makes ``{chroot}/elections``.
* ``set_value`` keeps the leader's value in the hold's EPHEMERAL owner znode: one multi,
  ``check`` of the job znode at version == generation and a versioned ``set_data`` of the
  owner znode (the checks of a release), sent from the claim's hold without reading
  first. So the value ends with the hold (release, expiry; the next claim's owner znode
  starts without one), ``get`` returns it as ``LeaseRecord.value`` while HELD, and a
  lost answer is read back through the nonce written with it. At most
  ``max_result_bytes``. Claims, renewals and completions of jobs are unchanged.

ZooKeeper guarantees relied on (`ZooKeeper Programmer's Guide
<https://zookeeper.apache.org/doc/r3.8.0/zookeeperProgrammers.html>`_):
sessions and their timeout negotiation ("ZooKeeper Sessions"); an ephemeral znode lives
exactly as long as the session that created it ("Ephemeral Nodes"); conditional updates
on a znode's version ("ZooKeeper Stat Structure", ``setData``/``delete`` with a version);
``multi`` applies all its operations or none ("Multi-op"); one client's requests are
applied and answered in order, and a write (the barrier's multi too) is answered only once
the quorum has committed it, so reads sent after a barrier see every write committed
before it ("ZooKeeper consistency guarantees"); ``sync``, before the reads that need no
barrier, makes the next read at least as new as the leader's view (same section); watches
fire once on change ("ZooKeeper Watches").

What the operator must do
-------------------------
* Size the servers' heap for ``store_max_jobs`` and ``store_max_bytes`` (heap needed ~
  16 MB + 3.5 x 500 x W + 2.5 x (store_max_jobs x 3 KB + store_max_bytes), W the largest
  transaction written in bulk, ``docs/capacity.md``); stores
  (chroots) sharing one ensemble share its heap. The defaults need ~550 MB with
  ``enqueue_many``: stock ZooKeeper's 1000 MB (``zkServer.sh``, ``ZK_SERVER_HEAP``) fits,
  and the kit and ``docker/`` run 640 MB; a smaller ``-Xmx`` of your own does not.
* After wiping the ensemble or restoring it from a backup: stop the workers and run
  ``consensus-lease bump-epoch --above HIGHEST`` (the highest token handed out). Once a
  backend noticed the history going back, every backend on the store refuses sessions
  (``StoreRegressed``) until then.
* Never delete job znodes (nor ``{chroot}/epoch`` or ``{chroot}/identity``) by hand, and
  never enqueue (or claim) a purged job id again: a job znode made anew starts at
  version 0, and its tokens would repeat.
* A job refused with ``TokenSpaceExhausted``: ``bump-epoch --above`` its token, then
  delete its znode.
* Keep the members' clocks synchronised (NTP): a retry delay's end compares two mtimes
  possibly set by two leaders.
* A queue written before layout 2 (``LegacyQueueLayout``): drain and purge it with the
  previous release, delete its znode, enqueue again.
* Install a kazoo in the tested range (``kazoo>=2.11,<2.12``, the ``[zookeeper]``
  extra), and raise ``timeout_s`` for ``records`` of a very large store and ``purge``
  of a very large queue (see the limits below).

Options (URL query string or keyword arguments of ``open_store``; keywords win; names
and value rules shared with the other backends, see :mod:`consensus_lease.options`;
anything else, a name given twice in the query string or an old name is
``InvalidArgument``):

====================  ==============================  ============================================
option                default                         meaning
====================  ==============================  ============================================
user, password        none                            digest authentication (``add_auth digest``)
acl                   ``creator`` with a user,        ACL of every znode created: ``open``
                      else ``open``                   (world:anyone), ``creator`` (only this
                                                      digest identity), ``creator_world_read``
tls                   false (true if ca_file,         TLS to the client port (kazoo ``use_ssl``)
                      cert_file or key_file is given)
ca_file               none                            CA bundle file to verify the servers
cert_file, key_file   none                            client certificate and key files
key_file_password     none                            password of ``key_file``
verify_certs          true                            verify the server certificate
check_hostname        false                           check the certificate's host name
connect_timeout_s     10.0                            seconds to wait for a session (or, in
                                                      ``open_store``, the shared client) to
                                                      open (then ``BackendUnavailable``)
timeout_s             10.0                            seconds one call may take, waiting for
                                                      answers or for a lost connection to come
                                                      back included (then ``BackendUnavailable``;
                                                      a write's read-back may add 1 s, then
                                                      ``OutcomeUnknown``)
max_result_bytes      1000000                         largest completion result, and leader
                                                      value (jute.maxbuffer is 1 MiB by default)
store_max_jobs        30000                           most jobs in the whole store: every queue
                                                      and named job (then ``QueueFull``); size
                                                      the servers' heap for it; 1 to 2**31 - 1
                                                      (``numChildren`` is a 32-bit int)
store_max_bytes       16777216                        most payload bytes in all the store's
                                                      queues together (then ``QueueFull``)
====================  ==============================  ============================================

Renamed: ``op_timeout_s`` -> ``timeout_s``, ``ca`` -> ``ca_file``, ``certfile`` ->
``cert_file``, ``keyfile`` -> ``key_file``, ``keyfile_password`` -> ``key_file_password``.
TLS files must exist when the store is opened.

``capabilities.min_ttl_s`` / ``max_ttl_s`` (0.2 s / 24 h) bound what may be *requested*;
the server clamps the request to its own range and the granted timeout is what counts.
``max_batch_claim`` is 128 claims per multi (split further to stay far below 1 MiB).
``complete_many`` (``max_complete_batch`` 128) sends one multi per up to 160 KB of
results with every item's completion operations, each applied whole or not at all: when
each item is held as this session's claims left it, one round trip per multi completes
the batch; when a multi applies nothing (an item stale or expired), each of its items is
completed alone and gets its own outcome. ``release_many`` and ``fail_many``
(``max_end_batch`` 128) work the same way: one multi per up to 160 KB of error texts
with every item's ``release`` / ``fail`` operations (the job znode's version check, the
owner znode's versioned delete, for a failure the failure znode's versioned write; one
mtime, so every retry delay of a multi starts at the same store time); a lost answer is
read back through the first item (its owner znode; its failure znode's nonce), and an
answer that cannot be read back is every item's ``OutcomeUnknown``, never re-sent.
``complete_and_claim_next`` is one multi, the
completion and the claim of a job read ahead (``fused_claim_next``), and
``claim_from_queue_many`` one claim multi per up to 128 jobs (``max_queue_claim_batch``):
see "Work queues" above.

kazoo versions: the driver is tested with ``kazoo>=2.11,<2.12`` (the pin of the
``[zookeeper]`` extra; ``_transport_kazoo.TESTED_SPEC``). The kazoo internals it relies on (its
private ``KazooClient._call``, its request records, ``last_zxid``, the handler's
``select``) are used in ``_transport_kazoo`` only. ``open_store`` checks the kazoo it imports:
one lacking an internal is refused with ``UnsupportedBackend`` naming it, before anything
is connected; one outside the tested range but with every internal warns
(``UntestedKazooWarning``, a ``UserWarning``) and goes on.

kazoo logs each failed connection attempt (a refused ``open_store`` makes some twenty
"Connection dropped" warnings): unless the application configured the ``kazoo`` logger,
the backend gives it a ``NullHandler``, so nothing is printed by default and handlers the
application sets up still get every record.

Limits worth knowing:

* ZooKeeper accepts any digest credentials at connect time: a wrong password shows up as
  ``AuthenticationFailed`` on the first znode its ACL protects. With the ``open`` ACL the
  credentials protect nothing. A refused TLS handshake (bad or missing certificate) is
  retried by kazoo and surfaces as ``BackendUnavailable`` after ``connect_timeout_s``.
* The negotiated timeout has no public kazoo API: it is read from the "Session created"
  call kazoo makes to its logger (see ``_transport_kazoo.NegotiatedTimeouts``). If a kazoo
  release stops making it, opening a session fails loudly rather than guess a TTL.
* A released job's record still names its last holder as ``owner`` (only a write to the
  job znode could clear it, and that would bump the version, which is the generation).
* Versions are 32-bit (ZooKeeper increments them without a check): a claim that would
  set a job znode's version above ``_jobs_claim.VERSION_CEILING`` (2**31 - 2**16 - 1) is
  refused with ``TokenSpaceExhausted`` (remedy: ``bump-epoch --above`` the job's token,
  then delete its znode); a queue's head is rotated to a fresh znode before its own
  ceiling (``_queues.HEAD_VERSION_CEILING``); every multi checks each version it carries
  is in [0, 2**31 - 1] before it is sent. See the store's page, "32-bit counters".
* Enqueues into one queue are serialised by the store (each takes the next ``seq`` with a
  versioned write): producers in several processes retry on collisions, so one queue
  takes roughly one enqueue per round trip to the leader however many producers it has.
* ``queue_candidates`` reads the payload of every candidate it returns that it has not
  seen (up to the ``limit`` asked, 32 from ``claim_next``; 8 MiB are cached per
  backend): with payloads near the limit, keep large data elsewhere and enqueue a
  reference to it.
* ``timeout_s`` bounds each call as a whole (one deadline from its start, however many
  round trips it makes; see ``_transport``), except ``queue_jobs``, whose reads are paced by
  progress (at most 50 in flight, each answer due within ``timeout_s`` of the previous:
  ``_transport_paged``): ``records`` of a very large store and ``purge`` of a very large
  queue must finish within it (a few thousand reads a second with kazoo), or fail with
  ``BackendUnavailable``: raise ``timeout_s`` for them (``queue_stats`` reads four
  znodes whatever the depth). At most
  100 requests per client are in flight at once, so kazoo never blocks a caller while it
  reconnects (``_transport_gate``).
* ``queue_jobs`` and ``purge`` read every bucket of the queue (their cost grows with it;
  ``queue_candidates``, ``wait_for_queue`` and ``queue_stats`` do not: see the queue
  layout above), and emptied buckets stay behind as a few znodes per 256 seqs. The
  capacity (``max_queue_jobs``) is per queue; every queue of the store shares the
  servers' heap, which ``store_max_jobs`` and ``store_max_bytes`` guard together.
* A waiter is also woken (spuriously) by every claim and completion in its queue; it
  looks again and waits again. ZooKeeper watches fire once and kazoo cannot remove one:
  a watch whose waiters all timed out stays registered (one per path) until it fires.
* A claim reads the job's ``queue`` tag and failure znode with the job (two more reads in
  the same round trip, also for jobs claimed by name); release, completion and fail use
  the markers it named. A claim+complete cycle of a job that has no retry delay
  recorded costs no more round trips than without the job lifecycle.
* The retry delay's end is compared between two mtimes possibly set by two leaders (a
  change of leader between the ``fail()`` and the claim): keep the members' clocks
  synchronised (NTP), as any deployment of ZooKeeper should. Resolution is 1 ms.
* A claim reads the job before its multi (one round trip on the session's own member,
  with no quorum) unless this backend never saw the job or released it itself: its
  version alone would not tell a completed job from a claimable one. A job made
  elsewhere (enqueued by another process, claimed by name) and never seen here costs its
  first claim a failing multi before the read: a write the quorum orders. Jobs seen
  (read, enqueued here, offered by ``queue_candidates``) are read first; the backend
  remembers 16,384 job ids.
"""

from ..._extras import needs_extra

try:
    from ._transport_kazoo import UntestedKazooWarning
    from .driver import ZooKeeperBackend
except ModuleNotFoundError as exc:  # the extra is not installed
    raise needs_extra(exc, "zookeeper", "the ZooKeeper backend") from exc

__all__ = ["UntestedKazooWarning", "ZooKeeperBackend"]
