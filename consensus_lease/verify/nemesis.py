"""The nemesis: faults on a schedule derived from the seed, each healed before the next.

The schedule is a pure function of (seed, fault menu, duration, TTL, slots):
:func:`plan` returns :class:`PlannedFault` records. Whatever the seed, it starts with one
fault of each kind asked for — ``pause-at-check`` first, the others in a seeded order —
and draws kinds at random after that, so every kind is exercised once the fault period
is at least :func:`coverage_s` long. :class:`Nemesis` runs them one at a time: inject,
hold, heal — and heals everything at the end. Each fault is one ``fault`` operation in
the history (invoked at injection, returned at healing: ``healed``, ``heal_error``, or
``skipped`` / ``error`` when it could not be injected), which is how the checker knows
what really happened.

========================  ============================================================
fault                     what it does
========================  ============================================================
``pause``                 SIGSTOP a worker at a random moment for 1.5-3 TTL, SIGCONT
``pause-at-check``        make a worker SIGSTOP itself between a passed
                          ``ensure_held()`` and its write; hold it until its next action is surely
                          stale (before a write: a newer generation has written the
                          job; before a completion: the store no longer shows it
                          holding the job) — at least 1.5 TTL, at most 8 TTL — then
                          SIGCONT
``kill``                  SIGKILL a worker; start a replacement after 0.2-1.5 TTL
``skew``                  replace a worker by one whose clock is off by 1 min-1 h
                          (either way) for 3-6 TTL, then by an unskewed one
``member-pause``          ``docker pause`` a cluster member for 1-3 TTL
``member-kill``           kill a member, restart it after 1-3 TTL
``leader-kill``           kill the current leader, restart it after 1-3 TTL
``partition``             drop one worker's traffic to every member (iptables, by the
                          worker's gid) for 1.5-3 TTL
========================  ============================================================

Cluster faults need a :class:`ClusterControl` (the verifier provides one when it started
the cluster itself); a fault plugs in by implementing :class:`Fault` and registering in
:data:`FAULTS`.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from ..errors import InvalidArgument
from .checker import STALE_FAULTS
from .history import HistoryWriter
from .interrupts import deferred
from .pool import PausePoint

__all__ = [
    "CLUSTER_FAULTS",
    "FAULTS",
    "STALE_FAULTS",
    "WORKER_FAULTS",
    "Active",
    "ClusterControl",
    "Fault",
    "Nemesis",
    "NemesisContext",
    "PlannedFault",
    "WorkerControl",
    "coverage_order",
    "coverage_s",
    "parse_faults",
    "plan",
]

WORKER_FAULTS = ("pause", "pause-at-check", "kill", "skew")
CLUSTER_FAULTS = ("member-pause", "member-kill", "leader-kill", "partition")
MAX_FAULTS = 10_000
_POLL_S = 0.02


# -- the schedule ---------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedFault:
    """One fault of the schedule.

    Attributes:
        at_s: earliest start, seconds after the fault period began.
        kind: a name in :data:`FAULTS`.
        target: worker slot (worker faults and ``partition``) or member index.
        hold_s: how long it lasts before healing, seconds (``pause-at-check``: the
            minimum; ``kill``: the delay before the replacement starts).
        value: fault-specific (``skew``: the clock offset in seconds).
    """

    at_s: float
    kind: str
    target: int
    hold_s: float
    value: float = 0.0


def parse_faults(text: str) -> tuple[str, ...]:
    """``"pause,kill"`` -> ``("pause", "kill")``; empty text means no faults.

    Raises:
        InvalidArgument: an unknown fault name (the message lists the menu).
    """
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise InvalidArgument(
            f"unknown fault(s) {', '.join(unknown)}; the menu: {', '.join(FAULTS)}"
        )
    return names


def coverage_order(rng: random.Random, kinds: Sequence[str]) -> list[str]:
    """Each kind once: ``pause-at-check`` first (it is the fault that puts a stale write
    in front of the fence, so it comes while every worker is busy), then the others in
    an order drawn from ``rng``."""
    distinct = list(dict.fromkeys(kinds))
    lead = [k for k in distinct if k in STALE_FAULTS]
    rest = [k for k in distinct if k not in STALE_FAULTS]
    rng.shuffle(rest)
    return lead + rest


def plan(seed: int, kinds: Sequence[str], *, duration_s: float, ttl_s: float, slots: int,
         members: int = 3) -> list[PlannedFault]:
    """The fault schedule for a run: a pure function of its arguments.

    Coverage first: the first faults are one of each kind (:func:`coverage_order`:
    ``pause-at-check`` first, at 0.5-1 TTL), then kinds are drawn at random. Faults
    follow each other (never overlap); a gap of 0.3-1 TTL separates them. The schedule
    covers ``duration_s`` assuming each fault takes its ``hold_s``, so a short
    ``duration_s`` may cut the coverage short (see :func:`coverage_s`); the
    :class:`Nemesis` stops starting faults once ``duration_s`` has really passed.
    """
    if not kinds or duration_s <= 0:
        return []
    rng = random.Random(seed)
    first = coverage_order(rng, kinds)
    out: list[PlannedFault] = []
    t = rng.uniform(0.5, 1.0) * ttl_s
    while t < duration_s and len(out) < MAX_FAULTS:
        kind = first[len(out)] if len(out) < len(first) else rng.choice(first)
        spec = FAULTS[kind]
        low, high = spec.hold_ttl
        hold = rng.uniform(low, high) * ttl_s
        target = rng.randrange(members if spec.targets_member else slots)
        value = 0.0
        if kind == "skew":
            value = rng.choice((-1.0, 1.0)) * rng.uniform(60.0, 3600.0)
        out.append(PlannedFault(round(t, 3), kind, target, round(hold, 3), round(value, 3)))
        t += hold + rng.uniform(0.3, 1.0) * ttl_s
    return out


def coverage_s(seed: int, kinds: Sequence[str], *, ttl_s: float, slots: int,
               members: int = 3) -> float:
    """Seconds of fault period the schedule of these arguments needs to start and hold
    one fault of each kind (as planned): a ``duration_s`` at least this long schedules
    every kind. 0.0 without kinds."""
    distinct = len(dict.fromkeys(kinds))
    if not distinct:
        return 0.0
    horizon = ttl_s * 10.0 * distinct + 1.0  # longer than any coverage prefix
    head = plan(seed, kinds, duration_s=horizon, ttl_s=ttl_s, slots=slots,
                members=members)[:distinct]
    return round(head[-1].at_s + head[-1].hold_s, 3)


# -- what the nemesis acts on ---------------------------------------------------------


class WorkerControl(Protocol):
    """The worker side (:class:`consensus_lease.verify.pool.WorkerPool`)."""

    def alive(self, slot: int) -> bool: ...
    def pause(self, slot: int) -> bool: ...
    def resume(self, slot: int) -> None: ...
    def kill(self, slot: int) -> bool: ...
    def start(self, slot: int, clock_offset_s: float = 0.0) -> object: ...
    def restart(self, slot: int, clock_offset_s: float = 0.0, *, graceful: bool = True) -> None:
        ...
    def arm_pause_at_check(self, slot: int) -> bool: ...
    def disarm(self, slot: int) -> bool: ...
    def stopped(self, slot: int) -> bool: ...
    def pause_points(self, slot: int) -> list[PausePoint]: ...
    def gid(self, slot: int) -> int | None: ...
    def resume_all(self) -> None: ...


class ClusterControl(Protocol):
    """The cluster side, when the verifier runs the cluster (see
    :mod:`consensus_lease.verify.kit`). Member names are opaque strings."""

    def member_names(self) -> list[str]: ...
    def pause_member(self, name: str) -> None: ...
    def unpause_member(self, name: str) -> None: ...
    def kill_member(self, name: str) -> None: ...
    def restart_member(self, name: str) -> None: ...
    def leader(self) -> str:
        """The current leader's name.

        Raises:
            Exception: no leader could be found in time (the fault is then skipped).
        """
        ...
    def cut_client(self, gid: int) -> Callable[[], None]:
        """Drop what group ``gid`` sends to every member; returns the healer."""
        ...
    def restore(self) -> None:
        """Heal partitions, thaw and start every member, wait until all serve."""
        ...


@dataclass
class NemesisContext:
    """What faults act on.

    Attributes:
        workers: the worker pool.
        ttl_s: the run's TTL (holds are multiples of it).
        overtaken: ``overtaken(point)`` is True once the stale action the worker stopped
            at (:class:`PausePoint`) would be stale: for a write, a newer generation has
            written the job at the destination; for a completion, the store no longer
            shows the worker's generation holding the job (for ``pause-at-check``).
        cluster: the cluster, or ``None`` (cluster faults are then unavailable).
        stop: set to abandon holds and waits early (the run is being aborted).
    """

    workers: WorkerControl
    ttl_s: float
    overtaken: Callable[[PausePoint], bool]
    cluster: ClusterControl | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def wait(self, seconds: float) -> bool:
        """Wait ``seconds``; True if the run is being aborted."""
        return self.stop.wait(max(0.0, seconds))


@dataclass
class Active:
    """An injected fault: what it is, how to hold it, how to heal it."""

    description: str
    heal: Callable[[], None]
    hold: Callable[[], None] | None = None
    """Custom hold (default: wait ``hold_s``)."""


class Fault(Protocol):
    """A kind of fault. ``inject`` returns ``None`` when it does not apply now (its
    target is gone); it must leave nothing behind in that case."""

    name: ClassVar[str]
    hold_ttl: ClassVar[tuple[float, float]]
    targets_member: ClassVar[bool]
    needs_cluster: ClassVar[bool]

    def inject(self, ctx: NemesisContext, planned: PlannedFault) -> Active | None: ...


# -- worker faults --------------------------------------------------------------------


class PauseWorker:
    name: ClassVar[str] = "pause"
    hold_ttl: ClassVar[tuple[float, float]] = (1.5, 3.0)
    targets_member: ClassVar[bool] = False
    needs_cluster: ClassVar[bool] = False

    def inject(self, ctx: NemesisContext, planned: PlannedFault) -> Active | None:
        slot = planned.target
        if not ctx.workers.pause(slot):
            return None
        return Active(f"SIGSTOP worker slot {slot} for {planned.hold_s:.2f} s",
                      heal=lambda: ctx.workers.resume(slot))


class PauseAtCheck:
    name: ClassVar[str] = "pause-at-check"
    hold_ttl: ClassVar[tuple[float, float]] = (1.5, 2.5)
    targets_member: ClassVar[bool] = False
    needs_cluster: ClassVar[bool] = False
    max_hold_ttl: ClassVar[float] = 8.0
    arm_timeout_ttl: ClassVar[float] = 6.0

    def inject(self, ctx: NemesisContext, planned: PlannedFault) -> Active | None:
        slot, workers = planned.target, ctx.workers
        seen = len(workers.pause_points(slot))
        if not workers.arm_pause_at_check(slot):
            return None
        give_up = time.monotonic() + max(2.0, self.arm_timeout_ttl * ctx.ttl_s)
        point: PausePoint | None = None
        while time.monotonic() < give_up and not ctx.stop.is_set():
            if workers.stopped(slot):
                points = workers.pause_points(slot)
                if len(points) > seen:
                    point = points[-1]
                    break
            if not workers.alive(slot):
                break
            time.sleep(_POLL_S)
        if point is None:  # no check reached in time (idle, or dead): undo the arming
            if not workers.disarm(slot):  # too late: it consumed it and is stopping now
                self._wait_stopped(ctx, slot)
            workers.resume(slot)
            return None
        stopped_at = time.monotonic()
        found = point

        def hold() -> None:
            ctx.wait(planned.hold_s)
            limit = stopped_at + self.max_hold_ttl * ctx.ttl_s
            while time.monotonic() < limit and not ctx.stop.is_set():
                if ctx.overtaken(found):
                    return
                time.sleep(_POLL_S * 5)

        return Active(
            f"worker slot {slot} stopped after a passed check on {found.job} generation "
            f"{found.generation}, before its {found.before} (step {found.step})",
            heal=lambda: workers.resume(slot),
            hold=hold,
        )


    @staticmethod
    def _wait_stopped(ctx: NemesisContext, slot: int) -> None:
        give_up = time.monotonic() + 5.0
        while (ctx.workers.alive(slot) and not ctx.workers.stopped(slot)
               and time.monotonic() < give_up):
            time.sleep(_POLL_S)


class KillWorker:
    name: ClassVar[str] = "kill"
    hold_ttl: ClassVar[tuple[float, float]] = (0.2, 1.5)
    targets_member: ClassVar[bool] = False
    needs_cluster: ClassVar[bool] = False

    def inject(self, ctx: NemesisContext, planned: PlannedFault) -> Active | None:
        slot = planned.target
        if not ctx.workers.kill(slot):
            return None
        def replace() -> None:
            ctx.workers.start(slot)

        return Active(f"SIGKILL worker slot {slot}; replacement after {planned.hold_s:.2f} s",
                      heal=replace)


class SkewWorker:
    name: ClassVar[str] = "skew"
    hold_ttl: ClassVar[tuple[float, float]] = (3.0, 6.0)
    targets_member: ClassVar[bool] = False
    needs_cluster: ClassVar[bool] = False

    def inject(self, ctx: NemesisContext, planned: PlannedFault) -> Active | None:
        slot = planned.target
        if not ctx.workers.alive(slot):
            return None
        ctx.workers.restart(slot, planned.value)
        return Active(f"worker slot {slot} restarted with its clock off by "
                      f"{planned.value:+.0f} s", heal=lambda: ctx.workers.restart(slot, 0.0))


# -- cluster faults -------------------------------------------------------------------


def _member(ctx: NemesisContext, planned: PlannedFault) -> tuple[ClusterControl, str]:
    if ctx.cluster is None:
        raise InvalidArgument(f"fault {planned.kind!r} needs a cluster started by the verifier")
    names = ctx.cluster.member_names()
    return ctx.cluster, names[planned.target % len(names)]


class PauseMember:
    name: ClassVar[str] = "member-pause"
    hold_ttl: ClassVar[tuple[float, float]] = (1.0, 3.0)
    targets_member: ClassVar[bool] = True
    needs_cluster: ClassVar[bool] = True

    def inject(self, ctx: NemesisContext, planned: PlannedFault) -> Active | None:
        cluster, member = _member(ctx, planned)
        cluster.pause_member(member)
        return Active(f"docker pause {member}", heal=lambda: cluster.unpause_member(member))


class KillMember:
    name: ClassVar[str] = "member-kill"
    hold_ttl: ClassVar[tuple[float, float]] = (1.0, 3.0)
    targets_member: ClassVar[bool] = True
    needs_cluster: ClassVar[bool] = True

    def inject(self, ctx: NemesisContext, planned: PlannedFault) -> Active | None:
        cluster, member = _member(ctx, planned)
        cluster.kill_member(member)
        return Active(f"kill {member}", heal=lambda: cluster.restart_member(member))


class KillLeader:
    name: ClassVar[str] = "leader-kill"
    hold_ttl: ClassVar[tuple[float, float]] = (1.0, 3.0)
    targets_member: ClassVar[bool] = True
    needs_cluster: ClassVar[bool] = True

    def inject(self, ctx: NemesisContext, planned: PlannedFault) -> Active | None:
        cluster, _ = _member(ctx, planned)
        leader = cluster.leader()
        cluster.kill_member(leader)
        return Active(f"kill leader {leader}", heal=lambda: cluster.restart_member(leader))


class PartitionWorker:
    name: ClassVar[str] = "partition"
    hold_ttl: ClassVar[tuple[float, float]] = (1.5, 3.0)
    targets_member: ClassVar[bool] = False
    needs_cluster: ClassVar[bool] = True

    def inject(self, ctx: NemesisContext, planned: PlannedFault) -> Active | None:
        if ctx.cluster is None:
            raise InvalidArgument("fault 'partition' needs a cluster started by the verifier")
        gid = ctx.workers.gid(planned.target)
        if gid is None or not ctx.workers.alive(planned.target):
            return None
        heal = ctx.cluster.cut_client(gid)
        return Active(f"cut worker slot {planned.target} (gid {gid}) off every member",
                      heal=heal)


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (PauseWorker(), PauseAtCheck(), KillWorker(), SkewWorker(), PauseMember(),
              KillMember(), KillLeader(), PartitionWorker())
}
"""The fault menu, by name."""


# -- running the schedule -------------------------------------------------------------


class Nemesis:
    """Runs a schedule against a :class:`NemesisContext`, recording each fault.

    Args:
        ctx: what to act on.
        recorder: the nemesis's history part.
        faults: the registry (default :data:`FAULTS`).
    """

    def __init__(self, ctx: NemesisContext, recorder: HistoryWriter,
                 faults: dict[str, Fault] | None = None) -> None:
        self.ctx = ctx
        self.rec = recorder
        self.faults = FAULTS if faults is None else faults
        self.injected = 0
        """Faults injected so far (read it from another thread to show progress)."""

    def run(self, schedule: Sequence[PlannedFault], duration_s: float) -> int:
        """Inject, hold and heal each planned fault in order, starting none after
        ``duration_s``; heal everything before returning. Returns faults injected
        (:attr:`injected`, which counts each fault as soon as it is injected)."""
        start = time.monotonic()
        try:
            for planned in schedule:
                now = time.monotonic() - start
                if now >= duration_s or self.ctx.stop.is_set():
                    break
                if self.ctx.wait(min(planned.at_s, duration_s) - now):
                    break
                if time.monotonic() - start >= duration_s:
                    break
                self._one(planned)
        finally:
            self.heal_all()
        return self.injected

    def _one(self, planned: PlannedFault) -> None:
        """One ``fault`` operation: invoked at injection, returned once healed."""
        index = self.rec.invoke("fault", kind=planned.kind, target=planned.target,
                                planned_hold_s=planned.hold_s, value=planned.value)
        try:
            active = self.faults[planned.kind].inject(self.ctx, planned)
        except Exception as error:  # a fault that cannot be injected is reported, not fatal
            self.rec.ret(index, "error", error=repr(error))
            return
        if active is None:
            self.rec.ret(index, "skipped", reason="target not available")
            return
        self.injected += 1
        held_from = time.monotonic()
        try:
            if active.hold is not None:
                active.hold()
            else:
                self.ctx.wait(planned.hold_s)
        finally:
            held_s = round(time.monotonic() - held_from, 3)
            try:
                active.heal()
            except Exception as error:
                self.rec.ret(index, "heal_error", description=active.description,
                             held_s=held_s, error=repr(error))
            else:
                self.rec.ret(index, "healed", description=active.description, held_s=held_s)

    def heal_all(self) -> None:
        """Thaw every worker and restore the cluster (healing partitions). A SIGINT or
        SIGTERM arriving meanwhile is raised once this is done
        (:func:`~consensus_lease.verify.interrupts.deferred`)."""
        with deferred():
            index = self.rec.invoke("heal_all")
            errors = []
            try:
                self.ctx.workers.resume_all()
            except Exception as error:
                errors.append(repr(error))
            if self.ctx.cluster is not None:
                try:
                    self.ctx.cluster.restore()
                except Exception as error:
                    errors.append(repr(error))
            self.rec.ret(index, "error" if errors else "ok", errors=errors)
