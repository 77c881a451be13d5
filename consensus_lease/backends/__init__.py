"""Store drivers. Each implements :class:`consensus_lease.backend.Backend` and is found
through the ``consensus_lease.backends`` entry-point group by URL scheme. Backends never
import each other."""
