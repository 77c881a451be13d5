"""Store drivers. Each implements :class:`consensus_lease.backend.Backend` and is found
through the ``consensus_lease.backends`` entry-point group by URL scheme. Backends never
import each other.

Every server driver (etcd, ZooKeeper, PostgreSQL, SQLite) is a package cut to one
template, so that a maintainer can read one driver beside another and a fix every store
needs is made in the module of the same name in each. The in-memory store
(:mod:`.memory`) is the reference and test fake, one module. The template's modules
(held by ``tests/unit/test_driver_template.py``):

================  =========================================================================
``__init__``      The package docstring: the URL and its options, the protocol told once
                  (each operation and the store primitive it is, the guarantees relied on
                  with the server's documentation), what the operator must do. Exports the
                  driver class.
``driver``        The driver class: every ``Backend`` method, each delegating to one module
                  below; the capabilities.
``_config``       The URL and options, parsed and checked before anything is sent.
``_transport``    The client: connections, failover, retries, timeouts, and the translation
                  of the client library's exceptions into :mod:`consensus_lease.errors`.
                  The only module that imports the client library's exceptions.
``_layout``       Where records live (keys, znodes, tables) and the codecs of what they hold.
``_sessions``     Opening, keeping alive and ending a worker session; the session handle.
``_jobs``         Claim, renew, complete, release, fail, requeue and ``set_value`` of one job
                  or a batch; ``refusal()``, the one rule that turns an operation the store
                  refused into the :class:`~consensus_lease.errors.LeaseError` it raises.
``_queues``       Work queues: enqueue, ``claim_next``, counts and stats, listing, purge,
                  capacity.
``_watches``      Waiting and subscriptions: watches, notifications, polling.
``_tokens``       Fencing tokens, the store epoch and ``bump_epoch``, noticing that the
                  store's history went back, and the refusal after it.
================  =========================================================================

A module that carries part of one of these is named after it: ``_queues_index`` is part of
``_queues``, ``_transport_keepalive`` part of ``_transport``. A driver may leave a module
out only where its store has nothing of that kind, and then says so in ``driver``.
"""

TEMPLATE = ("__init__", "driver", "_config", "_transport", "_layout", "_sessions", "_jobs",
            "_queues", "_watches", "_tokens")
"""The module names of every server driver's package, in the order of the table above."""
