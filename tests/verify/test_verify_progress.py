"""Progress while a run runs: claims, completions and visible violations counted from
growing history parts, the ticker, the terminal progress bar and the log lines."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

from rich.console import Console

from consensus_lease.verify.history import HistoryWriter
from consensus_lease.verify.progress import (
    HistoryTally,
    ProgressBar,
    RunStatus,
    StatusLines,
    StatusTicker,
)


def status(phase: str = "faults", elapsed_s: float = 3.0, injected: int = 2,
           completions: int = 5) -> RunStatus:
    return RunStatus(phase=phase, elapsed_s=elapsed_s, total_s=20.0, faults_injected=injected,
                     faults_planned=7, completions=completions, jobs=40, claims=completions + 3,
                     violations_seen=1, fenced=2, run_elapsed_s=3725.0)


def test_completions_are_counted_as_the_parts_grow(tmp_path: Path) -> None:
    a, b = tmp_path / "w0.jsonl", tmp_path / "w1.jsonl"
    w0, w1 = HistoryWriter(a, "w0"), HistoryWriter(b, "w1")
    counter = HistoryTally()
    assert counter.update([a, b, tmp_path / "not-yet.jsonl"]) == 0
    first = w0.invoke("complete", job="j1", generation=1)
    assert counter.update([a, b]) == 0  # not returned yet
    w0.ret(first, "ok")
    refused = w1.invoke("complete", job="j2", generation=1)
    w1.ret(refused, "stale")
    w1.event("write", job="j3", generation=2)  # an ok that is no completion
    assert counter.update([a, b]) == 1
    second = w1.invoke("complete", job="j3", generation=2)
    w1.close()
    with b.open("a", encoding="utf-8") as file:  # a line still being written
        file.write(f'{{"p": "w1", "i": {second}, "ev": "return", "outcome": "ok"')
    assert counter.update([a, b]) == 1
    with b.open("a", encoding="utf-8") as file:
        file.write(', "t": 1.0}\n')
    assert counter.update([a, b]) == 2
    assert counter.update([a, b]) == 2  # nothing read twice
    w0.close()


def test_the_ticker_reports_until_stopped_and_once_more_at_the_end() -> None:
    seen: list[RunStatus] = []
    got_two = threading.Event()

    def watch(s: RunStatus) -> None:
        seen.append(s)
        if len(seen) >= 2:
            got_two.set()

    with StatusTicker(lambda: status(completions=len(seen)), watch, interval_s=0.01):
        assert got_two.wait(10)
    count = len(seen)
    time.sleep(0.05)  # real time passing: five ticks would have come after stop
    assert len(seen) == count and seen[-1].completions == count - 1


def test_a_failing_watch_stops_the_ticking_not_the_run() -> None:
    calls: list[int] = []

    def watch(_s: RunStatus) -> None:
        calls.append(1)
        raise RuntimeError("terminal gone")

    ticker = StatusTicker(status, watch, interval_s=0.01).start()
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)  # poll interval of a deadline loop
    ticker.stop()
    assert calls == [1]


def test_the_bar_shows_the_phase_its_clock_faults_and_completions() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with ProgressBar(console) as bar:
        bar(status())
        bar(status(phase="quiet", elapsed_s=1.5, injected=3, completions=40))
    text = out.getvalue()
    assert "fault period" in text and "3.0 / 20.0 s" in text
    assert "faults 2/7" in text and "completed 5/40" in text and "claims 8" in text
    assert "violations seen 1" in text and "fenced 2" in text and "elapsed 1:02:05" in text
    assert "quiet period" in text and "faults 3/7" in text and "completed 40/40" in text


def _op(writer: HistoryWriter, op: str, job: str, generation: int, outcome: str) -> None:
    writer.ret(writer.invoke(op, job=job, generation=generation), outcome)


def test_claims_fence_rejections_and_visible_violations_are_counted(tmp_path: Path) -> None:
    """Whatever order the parts are read in, a write accepted after a higher generation's
    write had returned is seen as stale; so are a second completing generation and a
    claim above the completing one; each stale write counts once."""
    a, b = tmp_path / "w0.jsonl", tmp_path / "w1.jsonl"
    w0, w1 = HistoryWriter(a, "w0"), HistoryWriter(b, "w1")
    _op(w0, "claim", "j1", 1, "claimed")
    _op(w1, "claim", "j1", 2, "claimed")
    _op(w1, "write", "j1", 2, "accepted")
    _op(w0, "write", "j1", 1, "fence_rejected")
    _op(w1, "write", "j1", 2, "accepted")
    _op(w0, "write", "j1", 1, "accepted")          # stale: after generation 2's writes
    _op(w1, "claim", "j2", 1, "held")
    w1.close()
    tally = HistoryTally()
    tally.update([a])  # w0's part first: the stale write is seen once w1's arrives
    assert (tally.claims, tally.fenced, tally.violations) == (1, 1, 0)
    tally.update([a, b])
    assert (tally.claims, tally.fenced, tally.violations) == (2, 1, 1)
    _op(w0, "complete", "j1", 2, "ok")          # (the process does not matter)
    _op(w0, "complete", "j3", 4, "ok")
    _op(w0, "claim", "j3", 5, "claimed")          # claimed after its completion
    _op(w0, "complete", "j3", 5, "ok")            # ... and completed again
    w0.close()
    tally.update([a, b])
    assert (tally.claims, tally.completions, tally.violations) == (3, 3, 3)


def test_log_lines_come_every_interval_with_the_same_figures() -> None:
    lines: list[str] = []
    now = [100.0]
    watch = StatusLines(lines.append, every_s=30.0, clock=lambda: now[0])
    watch(status())
    now[0] += 29.0
    watch(status())
    assert lines == []
    now[0] += 1.5
    watch(status(completions=7))
    watch(status(completions=8))
    assert len(lines) == 1
    assert lines[0].startswith("progress: fault period 3.0 / 20.0 s")
    assert "claims 10  completed 7/40  violations seen 1  fenced 2" in lines[0]
