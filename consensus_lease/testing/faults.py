"""Network partitions on loopback: iptables OUTPUT rules matched by group id.

Every cluster member runs with its own gid (container ``--user 0:GID``), and a
worker process can be given one with ``setpriv --regid=GID --clear-groups``.
Source addresses cannot tell processes apart here (a connection to another
127.0.0.x address leaves from 127.0.0.1), so a link is cut by dropping what a
gid *sends* to an address::

    iptables -I OUTPUT -d 127.0.0.12/32 -m owner --gid-owner 4311 \\
        -m comment --comment clkit:PID:CLUSTER -j DROP

Cutting the A--B link both ways takes two rules (A's gid to B's address and
B's gid to A's address); that stops connections either side opens.

Each rule carries a comment tag naming the owning process and cluster, so
:meth:`Firewall.heal_all` removes exactly its own rules (also ones whose
:class:`Cut` handle was lost) and :func:`reap_stale_rules` removes those of
processes that died without cleaning up. Rules only ever name addresses in
127.0.0.0/8.
"""

from __future__ import annotations

import ipaddress
import os
import shlex
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType

TAG_PREFIX = "clkit:"
_LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


class FirewallError(RuntimeError):
    """An iptables command failed; the message carries its stderr."""


def _iptables(*args: str) -> str:
    try:
        done = subprocess.run(
            ["iptables", "-w", "5", *args], capture_output=True, text=True, timeout=15
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FirewallError(f"iptables {' '.join(args)}: {exc}") from exc
    if done.returncode != 0:
        raise FirewallError(f"iptables {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def make_tag(owner: str, pid: int | None = None) -> str:
    """The comment tag for rules owned by ``owner`` in process ``pid`` (default: this one)."""
    return f"{TAG_PREFIX}{os.getpid() if pid is None else pid}:{owner}"


@dataclass(frozen=True)
class DropRule:
    """Drop everything processes of group ``gid`` send to ``destination`` (a 127.x.y.z address)."""

    gid: int
    destination: str
    tag: str

    def __post_init__(self) -> None:
        if ipaddress.ip_address(self.destination) not in _LOOPBACK:
            raise ValueError(f"refusing a rule for non-loopback address {self.destination}")

    def spec(self) -> list[str]:
        return [
            "OUTPUT",
            "-d", f"{self.destination}/32",
            "-m", "owner", "--gid-owner", str(self.gid),
            "-m", "comment", "--comment", self.tag,
            "-j", "DROP",
        ]  # fmt: skip


def tagged_rules(tag_prefix: str = TAG_PREFIX, *, exact: bool = False) -> list[str]:
    """``iptables -S OUTPUT`` lines whose comment starts with (or, if ``exact``, is) the tag."""
    found = []
    for line in _iptables("-S", "OUTPUT").splitlines():
        words = shlex.split(line)
        if "--comment" in words:
            comment = words[words.index("--comment") + 1]
            if comment == tag_prefix or (not exact and comment.startswith(tag_prefix)):
                found.append(line)
    return found


def _delete_line(line: str) -> None:
    words = shlex.split(line)
    if words[:1] != ["-A"]:
        raise FirewallError(f"not an appended rule: {line!r}")
    _iptables("-D", *words[1:])


def reap_stale_rules() -> list[str]:
    """Delete tagged rules whose owning process is gone; returns the deleted lines."""
    reaped = []
    for line in tagged_rules():
        words = shlex.split(line)
        pid_text = words[words.index("--comment") + 1][len(TAG_PREFIX) :].split(":", 1)[0]
        if pid_text.isdigit() and not pid_alive(int(pid_text)):
            _delete_line(line)
            reaped.append(line)
    return reaped


def pid_alive(pid: int) -> bool:
    """True if process ``pid`` exists (on this machine's pid namespace)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Cut:
    """Rules in force until :meth:`heal`; use as a context manager to heal on exit."""

    def __init__(self, firewall: Firewall, rules: list[DropRule]) -> None:
        self._firewall = firewall
        self.rules = tuple(rules)

    def heal(self) -> None:
        """Remove this cut's rules. Idempotent."""
        self._firewall.remove(self.rules)

    def __enter__(self) -> Cut:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.heal()

    def __repr__(self) -> str:
        links = ", ".join(f"gid {r.gid} -/-> {r.destination}" for r in self.rules)
        return f"Cut({links})"


class Firewall:
    """Adds and removes the DROP rules of one owner (a cluster), tagged ``tag``."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self._active: list[DropRule] = []
        self._used = False  # no rule can carry our tag before the first cut()

    def cut(self, links: Iterable[tuple[int, str]]) -> Cut:
        """Drop traffic for each ``(gid, destination address)`` in ``links``.

        Raises:
            FirewallError: iptables failed; rules added before the failure are removed.
        """
        rules = [DropRule(gid, dest, self.tag) for gid, dest in links]
        added: list[DropRule] = []
        self._used = True
        try:
            for rule in rules:
                _iptables("-I", *rule.spec())
                added.append(rule)
                self._active.append(rule)
        except FirewallError:
            self.remove(added)
            raise
        return Cut(self, rules)

    def remove(self, rules: Iterable[DropRule]) -> None:
        """Delete ``rules`` that are still in force (each is removed at most once)."""
        for rule in rules:
            if rule in self._active:
                _iptables("-D", *rule.spec())
                self._active.remove(rule)

    def heal_all(self) -> None:
        """Delete every rule carrying this firewall's tag, whichever handle added it."""
        self._active.clear()
        if not self._used:
            return
        for line in tagged_rules(self.tag, exact=True):
            _delete_line(line)
