"""A command for the `consensus-lease run` tests: records its start and heartbeats.

    hb_child.py OUT [--ignore-term] [--grandchild OUT2] [--until FILE] [--max-s S]
                    [--check-dead OTHER_OUT ...]

OUT gets ``start WALL MONO PID TOKEN ATTEMPT JOB``, then ``peer PID STATE`` for each
--check-dead file (the state in /proc of the process that wrote that file's start line,
``gone`` if it has none), then ``hb WALL MONO`` every 20 ms until FILE exists or S seconds
passed, then ``end``. --grandchild starts another copy (same process group) writing to
OUT2 with --ignore-term.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


def main(argv: list[str]) -> None:
    out, args = argv[0], argv[1:]
    start_wall, start_mono = time.time(), time.monotonic()
    until = args[args.index("--until") + 1] if "--until" in args else None
    max_s = float(args[args.index("--max-s") + 1]) if "--max-s" in args else 30.0
    if "--ignore-term" in args:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    peers = args[args.index("--check-dead") + 1:] if "--check-dead" in args else []
    lines = [f"start {start_wall!r} {start_mono!r} {os.getpid()} "
             f"{os.environ.get('CONSENSUS_LEASE_TOKEN')} "
             f"{os.environ.get('CONSENSUS_LEASE_ATTEMPT')} "
             f"{os.environ.get('CONSENSUS_LEASE_JOB_ID')}"]
    for peer in peers:
        with open(peer) as f:
            pid = int(f.readline().split()[3])
        lines.append(f"peer {pid} {proc_state(pid)}")
    with open(out, "a") as f:
        f.write("\n".join(lines) + "\n")
        f.flush()
        if "--grandchild" in args:
            subprocess.Popen([sys.executable, __file__, args[args.index("--grandchild") + 1],
                              "--ignore-term", "--max-s", str(max_s)])
        while time.monotonic() - start_mono < max_s:
            if until is not None and os.path.exists(until):
                break
            f.write(f"hb {time.time()!r} {time.monotonic()!r}\n")
            f.flush()
            time.sleep(0.02)  # the heartbeat interval, not synchronisation
        f.write("end\n")


if __name__ == "__main__":
    main(sys.argv[1:])
