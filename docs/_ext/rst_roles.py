"""Griffe extension for the documentation build.

The package's docstrings use Sphinx-style roles (``:class:`~consensus_lease.lease.Lease```),
``::`` literal-block markers and reST simple tables, which Markdown shows verbatim:
rewrite them as inline code, plain colons and fenced blocks before rendering. And leave
out of the reference the special members that say nothing to a reader (``__slots__``,
undocumented dunder methods such as ``__repr__``). Only the rendered text changes; the
docstrings in the code stay as they are."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|data|attr|exc|obj|const):`([^`]+)`")
_LITERAL_MARKER = re.compile(r"(\S)::$", re.MULTILINE)
_TABLE_RULE = re.compile(r"^\s*=+(\s+=+)+\s*$")


def _target_text(target: str) -> str:
    """``~pkg.mod.Name`` -> ``Name``; ``.command`` -> ``command``; ``Title <x.y>`` -> ``Title``."""
    if target.endswith(">") and "<" in target:
        return target[: target.index("<")].strip()
    if target.startswith("~"):
        return target[1:].rsplit(".", 1)[-1]
    return target.lstrip(".")


def _fence_tables(lines: list[str]) -> list[str]:
    """Wrap each reStructuredText simple table (three ``====  ===`` rules) in a code fence,
    which shows its columns as written; Markdown has no such table syntax."""
    out: list[str] = []
    rules_seen = 0
    for line in lines:
        if _TABLE_RULE.match(line):
            indent = line[: len(line) - len(line.lstrip())]
            if rules_seen == 0:
                out += ["", indent + "```text"]
            rules_seen += 1
            out.append(line)
            if rules_seen == 3:
                out += [indent + "```", ""]
                rules_seen = 0
            continue
        # Inside a table, ``code`` markup would show its backticks: blank them out
        # (same width, so the columns stay aligned).
        out.append(line.replace("``", "  ") if rules_seen else line)
    return out


def rewrite(text: str) -> str:
    """Return ``text`` with roles as inline code, ``word::`` as ``word:`` and simple
    tables fenced."""
    text = _ROLE.sub(lambda m: f"`{_target_text(m.group(1))}`", text)
    text = _LITERAL_MARKER.sub(r"\1:", text)
    lines = [line for line in text.split("\n") if line.strip() != "::"]
    return "\n".join(_fence_tables(lines))


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__") and name != "__init__"


class RstRoles(griffe.Extension):
    """Rewrite every docstring once the object tree is built."""

    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
        if obj.is_class:
            for name, member in list(obj.members.items()):
                if _is_dunder(name) and (name == "__slots__" or member.docstring is None):
                    obj.del_member(name)

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        # The top-level package is not passed to on_object.
        if pkg.docstring is not None:
            pkg.docstring.value = rewrite(pkg.docstring.value)
