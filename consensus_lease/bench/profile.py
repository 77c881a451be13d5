"""``--profile``: where the time of one claim+complete cycle goes, per backend.

Runs the W1 single-worker loop in this process under pyinstrument (``pip install
pyinstrument``) and writes ``profile-BACKEND.txt``: a short call tree of wall time.
"""

from __future__ import annotations

import time
from pathlib import Path

from .config import Target
from .cycler import OursCycler

__all__ = ["profile_cycle"]


def profile_cycle(target: Target, duration_s: float, prefix: str, out: Path) -> str:
    """Profile ``duration_s`` seconds of cycles; return the file name written.

    Raises:
        ImportError: pyinstrument is not installed.
    """
    from pyinstrument import Profiler

    assert target.url is not None
    cycler = OursCycler(target.url)
    cycler.open()
    try:
        for i in range(10):
            cycler.cycle(f"{prefix}-warm-{i}")
        profiler = Profiler(interval=0.0005)
        cycles = 0
        profiler.start()
        stop_at = time.perf_counter() + duration_s
        for i in range(1_000_000):
            cycler.cycle(f"{prefix}-{i}")
            cycles += 1
            if time.perf_counter() >= stop_at:
                break
        profiler.stop()
    finally:
        cycler.close()
    name = f"profile-{target.backend}.txt"
    header = (f"pyinstrument wall-time profile of {cycles} claim+complete cycles on "
              f"{target.backend} ({duration_s:g} s, one in-process worker)\n\n")
    text = profiler.output_text(unicode=False, color=False, show_all=False)
    (out / name).write_text(header + text)
    return name
