"""ZooKeeper backend: ``zk://host:port[,host:port...]/chroot`` (also ``zookeeper://``).

::

    store = open_store("zk://127.0.0.21:2181,127.0.0.22:2181,127.0.0.23:2181/jobs-prod",
                       user="svc", password="...", connect_timeout_s=5)

How leases map onto ZooKeeper
-----------------------------
* A worker session is one ZooKeeper session, on its own kazoo client. Its TTL is the
  session timeout the server *negotiated* (clamped to [minSessionTimeout,
  maxSessionTimeout], by default 2-20 x tickTime): ``granted_ttl_s`` reports it and the
  local deadline uses it. ``keepalive()`` is one ``sync`` on the session's connection.
* Each job is a persistent znode ``{chroot}/jobs/{percent-encoded id}`` whose **version is
  the generation** (fencing token). A claim is one multi: ``set_data`` at the version just
  read (or ``create`` + ``set_data`` the first time) and ``create`` of the EPHEMERAL owner
  znode ``.../owner`` (owner label, session id, a nonce per claim). Tokens are consecutive.
* Completion is one multi: ``set_data`` of the completion record (result bytes and the
  generation that completed it) at version == generation, and ``delete`` of the owner
  znode. It bumps the version, so a claim prepared against the held state fails.
  Release is one multi: ``check`` version == generation and ``delete`` of the owner znode.
  Both first verify that the owner znode's ``ephemeralOwner`` is the caller's session.
* ``renew`` reads, after a ``sync``, the job znode's version and the owner znode's
  ``ephemeralOwner`` in one pipelined round trip.
* Connection states reach the core as session events: kazoo SUSPENDED -> SUSPENDED,
  CONNECTED again with the same session -> RECONNECTED, LOST -> EXPIRED. An expired
  session's client is never reused (kazoo would open a new session on it).
* kazoo pings on its own, so the backend ends a session itself when neither keepalive nor
  renew succeeded for one granted TTL (as an etcd lease would lapse): a worker whose
  renewal stopped does not keep its jobs for as long as its process lives.
* A lost answer to a multi is settled by reading back after reconnecting (owner znode's
  nonce and ephemeralOwner, completion record): never re-sent blindly, no orphaned owner
  znode, no double version bump. ``OutcomeUnknown`` only if reading back fails in time.
* ``get``/``records``/``wait_for_change`` use one shared client; ``wait_for_change`` waits
  on a watch on the owner znode. ``lease_until`` is always ``None``: ZooKeeper does not
  expose when a session will expire.
* Nothing but the job znodes (and ``{chroot}/jobs``) stays behind: owner znodes go with
  release, completion or the session. Never delete job znodes by hand: their version is
  the generation history, and a re-created znode would start again at 0.

ZooKeeper guarantees relied on (`ZooKeeper Programmer's Guide
<https://zookeeper.apache.org/doc/r3.8.0/zookeeperProgrammers.html>`_):
sessions and their timeout negotiation ("ZooKeeper Sessions"); an ephemeral znode lives
exactly as long as the session that created it ("Ephemeral Nodes"); conditional updates
on a znode's version ("ZooKeeper Stat Structure", ``setData``/``delete`` with a version);
``multi`` applies all its operations or none ("Multi-op"); one client's requests are
applied and answered in order and ``sync`` makes the next read at least as new as the
leader ("ZooKeeper consistency guarantees"); watches fire once on change ("ZooKeeper
Watches").

Options (URL query string or keyword arguments of ``open_store``; keywords win):

====================  ==============================  ============================================
option                default                         meaning
====================  ==============================  ============================================
user, password        none                            digest authentication (``add_auth digest``)
acl                   ``creator`` with a user,        ACL of every znode created: ``open``
                      else ``open``                   (world:anyone), ``creator`` (only this
                                                      digest identity), ``creator_world_read``
tls                   false (true if ca/certfile/     TLS to the client port (kazoo ``use_ssl``)
                      keyfile is given)
ca                    none                            CA bundle file to verify the servers
certfile, keyfile     none                            client certificate and key files
keyfile_password      none                            password of ``keyfile``
verify_certs          true                            verify the server certificate
check_hostname        false                           check the certificate's host name
connect_timeout_s     10.0                            seconds to wait for a session to open
                                                      (then ``BackendUnavailable``)
op_timeout_s          10.0                            seconds to wait for an answer or for a lost
                                                      connection to come back (then
                                                      ``BackendUnavailable`` / ``OutcomeUnknown``)
max_result_bytes      1000000                         largest completion result (jute.maxbuffer
                                                      is 1 MiB by default)
====================  ==============================  ============================================

``capabilities.min_ttl_s`` / ``max_ttl_s`` (0.2 s / 24 h) bound what may be *requested*;
the server clamps the request to its own range and the granted timeout is what counts.
``max_batch_claim`` is 100 claims per multi (split further to stay far below 1 MiB).

Limits worth knowing:

* ZooKeeper accepts any digest credentials at connect time: a wrong password shows up as
  ``AuthenticationFailed`` on the first znode its ACL protects. With the ``open`` ACL the
  credentials protect nothing. A refused TLS handshake (bad or missing certificate) is
  retried by kazoo and surfaces as ``BackendUnavailable`` after ``connect_timeout_s``.
* The negotiated timeout has no public kazoo API: it is read from the "Session created"
  call kazoo makes to its logger (see ``_session.NegotiatedTimeouts``). If a kazoo
  release stops making it, opening a session fails loudly rather than guess a TTL.
* A released job's record still names its last holder as ``owner`` (only a write to the
  job znode could clear it, and that would bump the version, which is the generation).
* Versions are 32-bit: about 2**31 claims per job.
* Sessions shorter than about 1 s see spurious SUSPENDED spells on a loaded machine:
  kazoo declares a connection dead after 2/3 of the session timeout without a reply.
"""

from ._backend import ZooKeeperBackend

__all__ = ["ZooKeeperBackend"]
