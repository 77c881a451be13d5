"""The SQL of the PostgreSQL store, written once per store (part of :mod:`._layout`; the
package docstring, :mod:`consensus_lease.backends.postgresql`, tells how each statement
keeps the protocol).

Every time is the server's clock read at the comparison (:data:`._layout.NOW`); lock
order is always the job row, then the session row. Every statement that keeps or uses a
session finds it alive only on the timeline it was opened on (:data:`._layout.TIMELINE`:
failover detection, ``MIGRATIONS`` 3 -> 4); reads that only show state do not compare it.
"""

from __future__ import annotations

from ._layout import NOW, SYSTEM_ID, TIMELINE, Names

__all__ = ["EXHAUSTED", "SESSION_GC_S", "Statements"]

SESSION_GC_S = 60.0
"""Seconds after its expiry after which ``open_session`` deletes a session row that holds
no job any more."""

EXHAUSTED = "(j.max_attempts IS NOT NULL AND j.attempt - j.attempt_base >= j.max_attempts)"


class Statements:
    """The statements of one store (schema names filled in once).

    Args:
        n: the store's names.
    """

    def __init__(self, n: Names) -> None:
        self._jobs = n.jobs
        # A batch write's compare, after its rows were locked (_upsert_held): the row
        # held by this session at the item's token, not completed.
        self._held_excluded = (
            "j.session_id = %(sid)s AND j.generation = excluded.generation "
            "AND j.epoch = excluded.epoch AND j.completed_at IS NULL "
        )
        self._conditions(n)
        self._writes(n)
        self._batch(n)
        self._completions(n)
        self._endings(n)

    def _conditions(self, n: Names) -> None:
        j, s = n.jobs, n.sessions
        self.alive_j = (f"EXISTS (SELECT 1 FROM {s} s WHERE s.session_id = j.session_id "
                        f"AND s.expires_at > {NOW})")
        # My session is alive, and on the server's timeline: a session row that came
        # over to a promoted standby (or back with a restored backup) is not.
        self.my_alive = (f"EXISTS (SELECT 1 FROM {s} s WHERE s.session_id = %(sid)s "
                         f"AND s.expires_at > {NOW} AND s.timeline = {TIMELINE})")
        # Free: unowned, its holder's session row is gone (closed, or collected long
        # after it expired: a session id is never reused), or that row is visibly
        # expired, locked while checked so that a concurrent keepalive is waited for
        # (package docstring). "Row gone" is a scalar subquery (NULL when there is no row,
        # session_id being the key), not NOT EXISTS: the planner may run a NOT EXISTS as
        # one hashed scan of every session row, and did so for claim_many on a
        # never-analysed store; a scalar subquery is always the key lookup per job.
        self.free_j = (f"(j.session_id IS NULL OR (SELECT true FROM {s} s WHERE "
                       "s.session_id = j.session_id) IS NULL OR EXISTS (SELECT 1 FROM "
                       f"{s} s WHERE s.session_id = j.session_id AND s.expires_at <= {NOW} "
                       "FOR SHARE))")
        self.claimable_j = (
            f"j.completed_at IS NULL AND j.failed_at IS NULL AND NOT {EXHAUSTED} "
            f"AND (j.not_before IS NULL OR j.not_before <= {NOW}) AND {self.free_j}"
        )
        self.select = (
            "SELECT j.job_id, j.owner, s.expires_at, j.generation, j.completed_at, j.result, "
            f"coalesce(s.expires_at > {NOW}, false), j.failed_at, j.attempt, j.error, "
            f"CASE WHEN j.not_before > {NOW} THEN j.not_before END, j.max_attempts, "
            f"j.epoch, j.value FROM {j} j LEFT JOIN {s} s ON s.session_id = j.session_id"
        )

    def _writes(self, n: Names) -> None:
        j, s = n.jobs, n.sessions
        # ``me``: the claiming session's row if it is alive, joined with the store epoch,
        # read once for the insert and the RETURNING (one index scan of the sessions
        # where a separate EXISTS and RETURNING subquery took two: the claim is W1's hot
        # path, and each scan is set up at every run). ``m.id = 1`` (the only row) keeps
        # the planner's estimate of ``me`` at one row on a never-analysed store.
        self.claim = (
            f"WITH me AS MATERIALIZED (SELECT m.epoch, s.expires_at FROM {n.meta} m, {s} s "
            f"WHERE m.id = 1 AND s.session_id = %(sid)s AND s.expires_at > {NOW} "
            f"AND s.timeline = {TIMELINE}) "
            f"INSERT INTO {j} AS j (job_id, generation, owner, session_id, attempt, epoch, "
            "closed) SELECT %(job)s, 1, %(owner)s, %(sid)s, 1, me.epoch, true FROM me "
            "ON CONFLICT (job_id) DO UPDATE SET generation = j.generation + 1, "
            "attempt = j.attempt + 1, not_before = NULL, epoch = excluded.epoch, "
            "owner = excluded.owner, session_id = excluded.session_id, value = NULL "
            f"WHERE {self.claimable_j} "
            "RETURNING j.generation, j.attempt, j.epoch, (SELECT expires_at FROM me)"
        )
        self.claim_notify = (
            f"WITH c AS ({self.claim}) SELECT c.*, pg_notify(%(chan)s, '') FROM c"
        )
        held = ("j.job_id = %(job)s AND j.session_id = %(sid)s AND j.generation = %(gen)s "
                f"AND j.epoch = %(epoch)s AND j.completed_at IS NULL AND {self.my_alive}")
        self.held = held
        # No notification: a completion makes nothing claimable (a waiter on the job
        # learns of it at its next poll), and NOTIFY serialises committing transactions.
        # It returns only what the caller does not know already (not the result it sent).
        self.complete = (
            f"UPDATE {j} j SET completed_at = {NOW}, completed_session = session_id, "
            "result = %(result)s, session_id = NULL, value = NULL, closed = true "
            f"WHERE {held} RETURNING j.owner, j.attempt, j.error, j.max_attempts"
        )
        self.completed_by_me = (
            f"SELECT 1 FROM {j} WHERE job_id = %(job)s AND generation = %(gen)s "
            "AND epoch = %(epoch)s AND completed_session = %(sid)s"
        )
        self.release = (
            f"WITH u AS (UPDATE {j} j SET session_id = NULL, owner = NULL, value = NULL "
            f"WHERE {held} RETURNING 1) SELECT pg_notify(%(chan)s, '') FROM u"
        )
        self.set_value = (
            f"WITH u AS (UPDATE {j} j SET value = %(value)s WHERE {held} RETURNING 1) "
            "SELECT pg_notify(%(chan)s, '') FROM u"
        )
        self.fail = (
            f"WITH u AS (UPDATE {j} j SET session_id = NULL, value = NULL, error = %(error)s, "
            f"failed_at = CASE WHEN {EXHAUSTED} THEN {NOW} END, "
            f"closed = CASE WHEN {EXHAUSTED} THEN true ELSE closed END, "
            f"not_before = CASE WHEN NOT {EXHAUSTED} AND %(retry)s > 0 "
            f"THEN {NOW} + %(retry)s END WHERE {held} RETURNING 1) "
            "SELECT pg_notify(%(chan)s, '') FROM u"
        )
        self._queue_claim(n)
        self._sessions(n)

    def _batch(self, n: Names) -> None:
        j, s = n.jobs, n.sessions
        # The claim of several named jobs, one upsert (rows locked in job-id order, so
        # two batches cannot deadlock on their job rows): an id with no row is inserted
        # as the claim above inserts it; an existing row nobody holds that is neither
        # completed nor FAILED is, per row, either claimed as the claim above claims it
        # (claimable_j) or, if its attempts are used up, marked FAILED as the refusal
        # below marks it (exhaust; then NULL job_id comes back). The two cases are
        # disjoint, and every CASE reads the row as it was. At least one row comes back:
        # the claimed ids (job_id NULL if none), and whether the session is alive.
        # One modifying part and few subqueries keep planning short (psycopg prepares
        # the statement, but the server plans its first five runs with their values);
        # the ids are sent in binary (no quoting to decide per id).
        ex = f"({EXHAUSTED})"
        self.claim_many = (
            f"WITH c AS (INSERT INTO {j} AS j (job_id, generation, owner, session_id, "
            f"attempt, epoch, closed) SELECT x.job, 1, %(owner)s, %(sid)s, 1, m.epoch, true FROM "
            f"unnest(%(jobs)b::text[]) x(job) CROSS JOIN {n.meta} m "
            f'WHERE m.id = 1 AND {self.my_alive} ORDER BY x.job COLLATE "C" '
            f"ON CONFLICT (job_id) DO UPDATE SET "
            f"generation = CASE WHEN {ex} THEN j.generation ELSE j.generation + 1 END, "
            f"attempt = CASE WHEN {ex} THEN j.attempt ELSE j.attempt + 1 END, "
            f"not_before = CASE WHEN {ex} THEN j.not_before END, "
            f"epoch = CASE WHEN {ex} THEN j.epoch ELSE excluded.epoch END, "
            f"owner = CASE WHEN {ex} THEN j.owner ELSE excluded.owner END, "
            f"session_id = CASE WHEN {ex} THEN NULL ELSE excluded.session_id END, "
            "value = NULL, "
            f"failed_at = CASE WHEN {ex} THEN {NOW} END, "
            f"closed = CASE WHEN {ex} THEN true ELSE j.closed END, "
            f"error = CASE WHEN {ex} THEN coalesce(j.error, 'attempts exhausted: attempt ' "
            "|| j.attempt || ' ended without completion') ELSE j.error END "
            "WHERE j.completed_at IS NULL AND j.failed_at IS NULL "
            f"AND ({ex} OR j.not_before IS NULL OR j.not_before <= {NOW}) "
            f"AND {self.free_j} "
            "RETURNING CASE WHEN j.failed_at IS NULL THEN j.job_id END, j.generation, "
            "j.attempt, j.epoch) "
            "SELECT c.*, "
            f"(SELECT expires_at FROM {s} WHERE session_id = %(sid)s), {self.my_alive} "
            "FROM (SELECT 1) one LEFT JOIN c ON true"
        )
        self.claimed_many = (
            f"SELECT j.job_id, j.generation, j.attempt, j.epoch, s.expires_at FROM {j} j "
            f"JOIN {s} s ON s.session_id = j.session_id WHERE j.job_id = ANY(%(jobs)s::text[]) "
            "AND j.session_id = %(sid)s AND j.completed_at IS NULL"
        )

    def _sessions(self, n: Names) -> None:
        j, s = n.jobs, n.sessions
        self.renew = (
            f"UPDATE {s} SET expires_at = {NOW} + ttl_s WHERE session_id = %(sid)s "
            f"AND expires_at > {NOW} AND timeline = {TIMELINE} "
            f"AND EXISTS (SELECT 1 FROM {j} j WHERE j.job_id = %(job)s "
            "AND j.session_id = %(sid)s AND j.generation = %(gen)s AND j.epoch = %(epoch)s "
            "AND j.completed_at IS NULL FOR SHARE) RETURNING ttl_s"
        )
        self.keepalive = (
            f"UPDATE {s} SET expires_at = {NOW} + ttl_s "
            f"WHERE session_id = %s AND expires_at > {NOW} AND timeline = {TIMELINE} "
            "RETURNING ttl_s"
        )
        # Only on the server cl_meta names (no row: StoreRegressed, see identity).
        self.open_session = (
            f"INSERT INTO {s} (session_id, owner, ttl_s, expires_at, timeline) "
            f"SELECT %s, %s, %s, {NOW} + %s, m.timeline FROM {n.meta} m WHERE m.id = 1 "
            f"AND m.timeline = {TIMELINE} AND m.system_id = {SYSTEM_ID} RETURNING expires_at"
        )
        # The server the store's history is on against the one answering, and the
        # session's timeline (after a refusal; also at open): see _tokens.expired.
        self.identity = (
            f"SELECT m.system_id, m.timeline, {SYSTEM_ID}, {TIMELINE}, m.epoch, "
            f"(SELECT timeline FROM {s} WHERE session_id = %s) FROM {n.meta} m WHERE m.id = 1"
        )
        # A job whose session row is gone is free (free_j): no need to look for them.
        self.gc_sessions = f"DELETE FROM {s} s WHERE s.expires_at < {NOW} - {SESSION_GC_S}"
        self.exhaust = (
            f"UPDATE {j} j SET failed_at = {NOW}, closed = true, session_id = NULL, "
            "value = NULL, error = coalesce(error, 'attempts exhausted: attempt ' || attempt || "
            "' ended without completion') WHERE j.job_id = %(job)s AND j.completed_at IS "
            f"NULL AND j.failed_at IS NULL AND {EXHAUSTED} AND {self.free_j}"
        )
        # After a refused claim, one statement: FAILED if the attempts are used up and
        # nobody holds the job (the CTE's result, since its change is not visible to the
        # outer SELECT of the same statement), then why the claim was refused.
        self.refusal = (
            f"WITH x AS ({self.exhaust} RETURNING j.failed_at, j.error) "
            "SELECT j.generation, j.completed_at, coalesce((SELECT failed_at FROM x), "
            "j.failed_at), j.attempt, coalesce((SELECT error FROM x), j.error), j.epoch, "
            f"{self.my_alive} FROM (SELECT 1) one LEFT JOIN {j} j ON j.job_id = %(job)s"
        )
        self.candidates = (
            f"SELECT j.job_id, j.payload FROM {j} j WHERE j.queue = %(queue)s "
            "AND j.closed IS NULL "
            "AND j.completed_at IS NULL AND j.failed_at IS NULL "
            f"AND (j.not_before IS NULL OR j.not_before <= {NOW}) AND NOT {self.alive_j} "
            "ORDER BY j.seq LIMIT %(limit)s"
        )

    def _queue_claim(self, n: Names) -> None:
        j, s = n.jobs, n.sessions
        open_in_queue = ("j.queue = %(queue)s AND j.closed IS NULL "
                         "AND j.completed_at IS NULL AND j.failed_at IS NULL")
        # One statement: fail the exhausted free jobs at the head of the queue, pick the
        # oldest claimable job nobody is locking right now (SKIP LOCKED), claim it with
        # the re-check of a named claim (the holder's session row locked), and report
        # what was picked even when the re-check refused it (a race: try again).
        self.claim_from_queue = (
            f"WITH dead AS (UPDATE {j} j SET failed_at = {NOW}, closed = true, "
            "session_id = NULL, "
            "value = NULL, error = coalesce(error, 'attempts exhausted: attempt ' || "
            "attempt || ' ended without completion') WHERE j.job_id IN (SELECT j.job_id "
            f"FROM {j} j WHERE {open_in_queue} AND {EXHAUSTED} AND NOT {self.alive_j} "
            "ORDER BY j.seq LIMIT 16 FOR UPDATE SKIP LOCKED) "
            f"AND j.completed_at IS NULL AND j.failed_at IS NULL AND {self.free_j} "
            "RETURNING 1), "
            f"pick AS (SELECT j.job_id FROM {j} j WHERE {open_in_queue} AND NOT {EXHAUSTED} "
            f"AND (j.not_before IS NULL OR j.not_before <= {NOW}) AND NOT {self.alive_j} "
            "ORDER BY j.seq LIMIT 1 FOR UPDATE SKIP LOCKED), "
            f"u AS (UPDATE {j} j SET generation = j.generation + 1, attempt = j.attempt + 1, "
            f"not_before = NULL, epoch = (SELECT epoch FROM {n.meta} WHERE id = 1), "
            "owner = %(owner)s, session_id = %(sid)s, value = NULL FROM pick "
            f"WHERE j.job_id = pick.job_id AND {self.claimable_j} AND {self.my_alive} "
            "RETURNING j.generation, j.attempt, j.epoch, j.payload, "
            f"(SELECT expires_at FROM {s} WHERE session_id = %(sid)s)) "
            "SELECT p.job_id, u.generation, u.attempt, u.epoch, u.payload, u.expires_at, "
            f"{self.my_alive}, (SELECT count(*) FROM dead) FROM (SELECT 1) one "
            "LEFT JOIN pick p ON true LEFT JOIN u ON true"
        )
        # claim_next_many: the same parts with the pick LIMIT %(n)s (SKIP LOCKED: rows
        # others lock are passed over, not counted): one row per job claimed, oldest
        # first, or one row of NULLs; each row also says whether the session is alive,
        # how many exhausted jobs became FAILED and how many rows were picked (more than
        # were claimed: a re-check lost a race).
        many = self.claim_from_queue.replace(
            "ORDER BY j.seq LIMIT 1 FOR UPDATE SKIP LOCKED",
            "ORDER BY j.seq LIMIT %(n)s FOR UPDATE SKIP LOCKED", 1)
        many = many.replace("RETURNING j.generation, j.attempt,",
                            "RETURNING j.job_id, j.seq, j.generation, j.attempt,", 1)
        many = many.replace(
            "SELECT p.job_id, u.generation,", "SELECT u.job_id, u.generation,", 1)
        many = many.replace(
            "(SELECT count(*) FROM dead) FROM (SELECT 1) one "
            "LEFT JOIN pick p ON true LEFT JOIN u ON true",
            "(SELECT count(*) FROM dead), (SELECT count(*) FROM pick) FROM (SELECT 1) one "
            "LEFT JOIN u ON true ORDER BY u.seq", 1)
        assert "%(n)s" in many and "u.job_id" in many and "ORDER BY u.seq" in many
        self.claim_from_queue_many = many
        self.held_in_queue = (
            f"SELECT 1 FROM {j} WHERE queue = %(queue)s AND session_id = %(sid)s "
            "AND completed_at IS NULL AND NOT job_id = ANY(%(mine)s::text[]) LIMIT 1"
        )

    def _completions(self, n: Names) -> None:
        # complete_and_claim_next: the completion of ``complete`` (done), then the claim
        # of claim_from_queue gated on it (a refused completion claims nothing and
        # fails no exhausted job), in one statement. The pick sees the snapshot before
        # the completion: the job just completed was this live session's, never picked.
        gate = "EXISTS (SELECT 1 FROM done)"
        fused = self.claim_from_queue.replace(
            "WITH dead AS (", f"WITH done AS ({self.complete}), dead AS (", 1)
        fused = fused.replace(
            f"AND {EXHAUSTED} AND NOT {self.alive_j} ",
            f"AND {EXHAUSTED} AND NOT {self.alive_j} AND {gate} ", 1)
        fused = fused.replace(
            f"AND (j.not_before IS NULL OR j.not_before <= {NOW}) AND NOT {self.alive_j} "
            "ORDER BY j.seq LIMIT 1 FOR UPDATE SKIP LOCKED",
            f"AND (j.not_before IS NULL OR j.not_before <= {NOW}) AND NOT {self.alive_j} "
            f"AND {gate} ORDER BY j.seq LIMIT 1 FOR UPDATE SKIP LOCKED", 1)
        fused = fused.replace(
            "SELECT p.job_id, u.generation",
            "SELECT d.owner, d.attempt, d.error, d.max_attempts, p.job_id, u.generation", 1)
        fused = fused.replace("LEFT JOIN pick p ON true",
                              "LEFT JOIN done d ON true LEFT JOIN pick p ON true", 1)
        assert fused.count(gate) == 2 and "done d" in fused
        self.complete_claim_next = fused
        # complete_many: every item's completion of ``complete`` in one statement (the
        # form: _upsert_held).
        self.complete_many = (
            self._upsert_held(", result", ", %(results)s::bytea[]")
            + f"completed_at = {NOW}, completed_session = j.session_id, "
            "result = excluded.result, session_id = NULL, value = NULL, closed = true "
            "WHERE " + self._held_excluded
            + "RETURNING j.job_id, j.owner, j.attempt, j.error, j.max_attempts"
        )
        self.completed_many_by_me = self._items_where("j.completed_session = %(sid)s")

    def _upsert_held(self, cols: str, arrays: str) -> str:
        """The start of a batch write of held jobs, up to its ``DO UPDATE SET``: the
        items (``%(jobs)s``, ``%(gens)s``, ``%(epochs)s`` and ``arrays``, one element per
        item, the job ids distinct) as the rows proposed by an ``INSERT ... ON CONFLICT
        (job_id) DO UPDATE`` (the form of claim_many), so that each item's row is found
        by the conflict check, a lookup of the primary key per item, and by no join the
        planner could turn into a scan of every job row on missing or stale statistics
        (an ``UPDATE ... FROM`` of the items was: a nested loop over them per row, or a
        sequential scan). Each item is proposed only with its job row locked, one key
        lookup per item (a lateral subquery runs per item), in job-id order (bytewise,
        ``COLLATE "C"``, as claim_many locks): concurrent batches never wait for each
        other in a cycle, and no proposed row is ever inserted (an id without a row is
        not proposed; a locked row cannot be deleted). The ``DO UPDATE ... WHERE`` is
        checked on the row's newest version, as an ``UPDATE``'s is. Nothing is locked
        when this session is not alive (on the server's timeline). ``excluded`` is the
        item: ``generation`` and ``epoch`` its token; ``cols`` its other values, in
        columns of the row."""
        return (
            f"INSERT INTO {self._jobs} AS j (job_id, generation, epoch{cols}) "
            "SELECT t.* FROM (SELECT * FROM unnest(%(jobs)s::text[], %(gens)s::bigint[], "
            f"%(epochs)s::bigint[]{arrays}) AS t(job_id, generation, epoch{cols}) "
            'ORDER BY t.job_id COLLATE "C") t CROSS JOIN LATERAL (SELECT FROM '
            f"{self._jobs} k WHERE k.job_id = t.job_id FOR UPDATE) k WHERE {self.my_alive} "
            'ORDER BY t.job_id COLLATE "C" ON CONFLICT (job_id) DO UPDATE SET '
        )

    def _items_where(self, cond: str) -> str:
        """The items' ids (the arrays of :meth:`_upsert_held`) whose job row is at the
        item's token and meets ``cond`` (a read after a lost answer): each row read by
        its key in a scalar subquery, run per item (a join the planner may make a scan
        of every job row, or a scan of the items per row)."""
        return (
            "SELECT t.job_id FROM unnest(%(jobs)s::text[], %(gens)s::bigint[], "
            "%(epochs)s::bigint[]) AS t(job_id, gen, epoch) WHERE (SELECT true FROM "
            f"{self._jobs} j WHERE j.job_id = t.job_id AND j.generation = t.gen "
            f"AND j.epoch = t.epoch AND {cond})"
        )

    def _endings(self, n: Names) -> None:
        j = n.jobs
        # release_many / fail_many: every item's compare and write of ``release`` /
        # ``fail`` in one statement (the form: _upsert_held), one notification if any
        # item applied; a row per item that applied (fail_many: the record's columns,
        # in the order of ``select``: the job is held by nobody after it).
        notify = ("n AS (SELECT pg_notify(%(chan)s, '') AS x WHERE EXISTS (SELECT 1 FROM u)) "
                  "SELECT u.*, (SELECT count(*) FROM n) FROM u")
        self.release_many = (
            "WITH u AS (" + self._upsert_held("", "")
            + "session_id = NULL, owner = NULL, value = NULL WHERE " + self._held_excluded
            + "RETURNING j.job_id), " + notify
        )
        # The item's retry delay (seconds) is proposed in not_before.
        self.fail_many = (
            "WITH u AS ("
            + self._upsert_held(", error, not_before",
                                ", %(errors)s::text[], %(retries)s::float8[]")
            + "session_id = NULL, value = NULL, error = excluded.error, "
            f"failed_at = CASE WHEN {EXHAUSTED} THEN {NOW} END, "
            f"closed = CASE WHEN {EXHAUSTED} THEN true ELSE j.closed END, "
            f"not_before = CASE WHEN NOT {EXHAUSTED} AND excluded.not_before > 0 "
            f"THEN {NOW} + excluded.not_before END WHERE " + self._held_excluded
            + "RETURNING j.job_id, j.owner, NULL::double precision AS expires_at, "
            "j.generation, j.completed_at, j.result, false AS alive, j.failed_at, j.attempt, "
            f"j.error, CASE WHEN j.not_before > {NOW} THEN j.not_before END AS not_before, "
            "j.max_attempts, j.epoch, j.value), " + notify
        )
        # After a lost answer: which items this session still holds at their generation
        # (none: the statement applied, or held none of them).
        self.held_many = self._items_where(
            "j.session_id = %(sid)s AND j.completed_at IS NULL")
        # A fail that did not apply (or whose answer was lost): this session's failure
        # at that generation already (the hold ended, the error ours), as fail settles.
        self.failed_by_me = (
            f"SELECT 1 FROM {j} WHERE job_id = %(job)s AND generation = %(gen)s "
            "AND epoch = %(epoch)s AND session_id IS NULL AND error = %(error)s "
            "AND completed_at IS NULL"
        )
