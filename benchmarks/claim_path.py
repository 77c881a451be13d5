"""The walk of one ``session.claim()`` through the project's files (docs/architecture.md).

``python benchmarks/claim_path.py URL`` opens a session on the store at ``URL``, claims one
job to warm caches, then traces one more claim (no wait) with ``sys.setprofile`` on
every thread: it prints each call from one project file into another, in order, then the
files whose functions ran. Both jobs are completed and the session closed at the end.

Example (a throw-away SQLite file)::

    python benchmarks/claim_path.py sqlite:////tmp/claim-path.db
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import uuid
from types import FrameType
from typing import Any

import consensus_lease
from consensus_lease import LeaseError, open_store

ROOT = os.path.dirname(consensus_lease.__file__)


def trace_claim(url: str) -> tuple[list[tuple[str, str, str]], set[str]]:
    """``(calls, files)``: each call ``(caller file, callee file, function)`` that crosses
    from one file into a project file, in order, and the project files that ran."""
    calls: list[tuple[str, str, str]] = []
    files: set[str] = set()

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(ROOT):
            return
        callee = os.path.relpath(frame.f_code.co_filename, ROOT)
        files.add(callee)
        back = frame.f_back.f_code.co_filename if frame.f_back else ""
        if back != frame.f_code.co_filename:
            caller = os.path.relpath(back, ROOT) if back.startswith(ROOT) else "(caller)"
            calls.append((caller, callee, frame.f_code.co_name))

    prefix = uuid.uuid4().hex[:8]
    with open_store(url) as store, store.session("claim-path", ttl_s=30) as session:
        warm = session.claim(f"{prefix}-warm")
        sys.setprofile(profile)
        threading.setprofile(profile)
        try:
            lease = session.claim(f"{prefix}-traced")
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
        for held in (warm, lease):
            if held is not None:
                held.complete()
    return calls, files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="store URL, e.g. sqlite:////tmp/claim-path.db")
    try:
        calls, files = trace_claim(parser.parse_args().url)
    except LeaseError as exc:  # a bad URL, a store that does not answer: say it plainly
        raise SystemExit(f"claim_path: {type(exc).__name__}: {exc}") from None
    for caller, callee, name in calls:
        print(f"{caller:40s} -> {callee:40s} {name}")
    print(f"{len(files)} files: {', '.join(sorted(files))}")


if __name__ == "__main__":
    main()
