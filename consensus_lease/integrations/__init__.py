"""Adapters that put consensus_lease under other libraries' APIs (each needs its extra).

* :mod:`consensus_lease.integrations.tooz`: a tooz driver (``pip install
  consensus_lease[tooz]``): fenced locks, elections and groups on every store.
"""
