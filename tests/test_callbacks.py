"""No silent callback failure (issue 25, item 7): an ``on_lost`` callback of the wrong
shape is refused when registered, and one that raises is logged where an unconfigured
logging setup shows it (stderr) and counted."""

from __future__ import annotations

import asyncio
import functools
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from consensus_lease import InvalidArgument, LeaseLost, open_store
from consensus_lease.aio import AsyncLeaseStore
from consensus_lease.observe import Observer
from consensus_lease.testing.conformance import poll_until


def _two(a: Any, b: Any) -> None: ...


class _Counting(Observer):
    def __init__(self) -> None:
        self.failed: list[tuple[str, str]] = []

    def callback_failed(self, store: str, registration: str) -> None:
        self.failed.append((store, registration))


BAD: list[Any] = [lambda: None, lambda reason: None, lambda a, b, c: None,
                  lambda *, session, reason: None]
GOOD: list[Any] = [_two, lambda a, b, c=1: None, lambda *args: None,
                   functools.partial(lambda x, a, b: None, 1), print, lambda a, b, **kw: None]


@pytest.mark.parametrize("callback", BAD)
def test_a_callback_of_the_wrong_shape_is_refused_and_nothing_registered(callback: Any) -> None:
    with open_store("memory://") as store, store.session("A", 30) as session:
        lease = session.claim("job")
        assert lease is not None
        with pytest.raises(InvalidArgument, match=r"Session.on_lost.*\(session, reason\)"):
            session.on_lost(callback)
        with pytest.raises(InvalidArgument, match=r"Lease.on_lost.*\(lease, reason\)"):
            lease.on_lost(callback)
        with pytest.raises(InvalidArgument):
            session.on_lost("not callable")  # type: ignore[arg-type]
        store.backend.expire_session(session.session_id)  # type: ignore[attr-defined]
        with pytest.raises(LeaseLost):
            poll_until(lambda: session.keepalive() and False, 10)
        # nothing was registered: the loss above called no callback (it would raise)


@pytest.mark.parametrize("callback", GOOD)
def test_callbacks_that_can_take_two_arguments_are_accepted(callback: Any) -> None:
    with open_store("memory://") as store, store.session("A", 30) as session:
        lease = session.claim("job")
        assert lease is not None
        session.on_lost(callback)()
        lease.on_lost(callback)()


async def _async_two(a: Any, b: Any) -> None: ...


class _AsyncCall:
    async def __call__(self, a: Any, b: Any) -> None: ...


ASYNC: list[Any] = [_async_two, functools.partial(_async_two, 1),
                    functools.partial(functools.partial(_async_two), 1), _AsyncCall()]


@pytest.mark.parametrize("callback", ASYNC)
def test_an_async_def_callback_is_refused_pointing_at_aio(callback: Any) -> None:
    """It would never run (called, not awaited): refused, nothing registered."""
    with open_store("memory://") as store, store.session("A", 30) as session:
        lease = session.claim("job")
        assert lease is not None
        with pytest.raises(InvalidArgument, match=r"Session.on_lost.*async def.*aio"):
            session.on_lost(callback)
        with pytest.raises(InvalidArgument, match=r"Lease.on_lost.*async def.*aio"):
            lease.on_lost(callback)


def test_async_on_lost_checks_the_shape() -> None:
    async def main() -> None:
        async with AsyncLeaseStore(open_store("memory://")) as store:
            session = await store.session("A", 30)
            with pytest.raises(InvalidArgument, match=r"AsyncSession.on_lost"):
                session.on_lost(lambda reason: None)
            with pytest.raises(InvalidArgument, match=r"AsyncSession.on_lost.*async def"):
                session.on_lost(_async_two)
            session.on_lost(_two)()
            await session.close()

    asyncio.run(main())


def test_a_raising_callback_is_counted_and_the_others_still_run() -> None:
    observer = _Counting()
    ran: list[str] = []
    with open_store("memory://", observer=observer) as store:
        session = store.session("A", 30)
        lease = session.claim("job")
        assert lease is not None

        def boom(_: Any, __: Any) -> None:
            raise RuntimeError("the application's bug")

        session.on_lost(boom)
        lease.on_lost(boom)
        session.on_lost(lambda s, r: ran.append("session"))
        lease.on_lost(lambda s, r: ran.append("lease"))
        store.backend.expire_session(session.session_id)  # type: ignore[attr-defined]
        with pytest.raises(LeaseLost):
            poll_until(lambda: session.keepalive() and False, 10)
        poll_until(lambda: len(observer.failed) == 2 and len(ran) == 2, 10)
    assert sorted(observer.failed) == [("memory", "Lease.on_lost"),
                                      ("memory", "Session.on_lost")]
    assert sorted(ran) == ["lease", "session"]


SCRIPT = textwrap.dedent("""
    import sys, time
    from consensus_lease import open_store
    store = open_store("memory://")
    session = store.session("A", 30)
    def boom(_session, _reason):
        raise RuntimeError("callback bug 7a")
    session.on_lost(boom)
    store.backend.expire_session(session.session_id)
    try:
        session.keepalive()
    except Exception:
        pass
    time.sleep(0)  # the callback ran in this thread, before keepalive raised
    store.close()
""")


@pytest.mark.parametrize("configured", [False, True])
def test_a_raising_callback_is_shown_by_a_default_logging_setup(configured: bool) -> None:
    """Logging never configured: the failure is on stderr (Python's lastResort), with
    its traceback. Configured: through the application's handlers, exactly once."""
    setup = "import logging; logging.basicConfig(format='APP %(name)s %(message)s')\n"
    done = subprocess.run([sys.executable, "-c", (setup if configured else "") + SCRIPT],
                          capture_output=True, text=True, timeout=60, check=True)
    assert "RuntimeError: callback bug 7a" in done.stderr, done.stderr
    assert "Session.on_lost callback" in done.stderr
    assert done.stderr.count("RuntimeError: callback bug 7a") == 1, done.stderr
    assert ("APP consensus_lease.callbacks" in done.stderr) is configured
