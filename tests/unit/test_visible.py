"""Operator signals shown by a default (unconfigured) logging setup, once when configured:
the SQLite WAL-blocked WARNING and the etcd early-revocation ERROR
(consensus_lease._visible.log_visible; the callback failure: tests/test_callbacks.py)."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest

from consensus_lease._visible import log_visible

WAL = textwrap.dedent("""
    from consensus_lease.backends.sqlite._transport_wal import WalGuard
    guard = WalGuard("/nonexistent/x.db", limit_bytes=1024, interval_s=1.0,
                     report=lambda size, blocked: None)
    guard._tell(64 * 1024 * 1024, True)  # never started: only the report path runs
""")

ETCD = textwrap.dedent("""
    from types import SimpleNamespace
    from consensus_lease.backends.etcd.driver import EtcdBackend
    driver = SimpleNamespace(observer=None, scheme="etcd")
    handle = SimpleNamespace(session_id="5eed", owner="A")
    EtcdBackend._report_early(driver, handle, (100.0, 10.0, "m1"), 103.0,
                              "a keepalive answered TTL 0", "m2", 0)
""")

SIGNALS = {
    "wal": (WAL, "checkpoints cannot shrink it", "consensus_lease"),
    "etcd": (ETCD, "the store ended its lease 7.000 s before", "consensus_lease.etcd"),
}


@pytest.mark.parametrize("configured", [False, True])
@pytest.mark.parametrize("signal", sorted(SIGNALS))
def test_an_operator_signal_is_on_stderr_without_logging_set_up(
    signal: str, configured: bool,
) -> None:
    script, text, logger = SIGNALS[signal]
    setup = "import logging; logging.basicConfig(format='APP %(name)s %(message)s')\n"
    done = subprocess.run([sys.executable, "-c", (setup if configured else "") + script],
                          capture_output=True, text=True, timeout=60, check=True)
    assert done.stderr.count(text) == 1, done.stderr
    assert (f"APP {logger} " in done.stderr) is configured, done.stderr


def test_a_disabled_logger_or_a_filter_shows_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Only NullHandlers in the chain (pytest's own capture handlers sit on the root
    logger, so a fresh non-propagating logger is used)."""
    logger = logging.getLogger("consensus_lease.test_visible")
    logger.propagate = False
    logger.addHandler(logging.NullHandler())
    try:
        log_visible(logger, logging.WARNING, "shown %s", 1)
        logger.addFilter(lambda record: False)
        log_visible(logger, logging.WARNING, "filtered %s", 2)
        logger.filters.clear()
        logger.disabled = True
        log_visible(logger, logging.WARNING, "disabled %s", 3)
        logger.disabled = False
        log_visible(logger, logging.INFO, "below lastResort %s", 4)
    finally:
        logger.disabled = False
        logger.filters.clear()
        logger.handlers.clear()
        logger.propagate = True
    err = capsys.readouterr().err
    assert "shown 1" in err
    assert "filtered" not in err and "disabled" not in err and "below" not in err
