"""Griffe extension for the documentation build.

The package's docstrings use Sphinx-style roles (``:class:`~consensus_lease.lease.Lease```),
``::`` literal-block markers and reST simple tables, which Markdown shows verbatim:
rewrite them as inline code, plain colons and Markdown tables before rendering. And leave
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


def _cells(line: str, starts: list[int]) -> list[str]:
    """The cells of ``line`` at the column ``starts``; a word running past its column's
    end (``QDIR/i/ORD/HEX`` one character too wide) stays in its cell."""
    cuts = [0]
    for start in starts[1:]:
        while 0 < start < len(line) and not line[start - 1].isspace() \
                and not line[start].isspace():
            start += 1
        cuts.append(max(start, cuts[-1]))
    bounds = [*cuts[1:], None]
    return [line[a:b].strip() for a, b in zip(cuts, bounds, strict=True)]


def _merge(rows: list[list[str]]) -> list[str]:
    return [" ".join(filter(None, column)) for column in zip(*rows, strict=True)]


def _parse_table(lines: list[str], start: int) -> tuple[list[list[str]], int] | None:
    """The rows of the reST simple table whose top rule is ``lines[start]``, the header
    first (a table without a header rule takes its first row for one), and the index of
    its bottom rule; ``None`` if it is not one this parser knows."""
    starts = [m.start() for m in re.finditer(r"=+", lines[start])]
    sections: list[list[list[str]]] = [[]]  # rows between rules; a row: its lines' cells
    for j in range(start + 1, len(lines)):
        line = lines[j]
        if _TABLE_RULE.match(line):
            if j + 1 < len(lines) and lines[j + 1].strip():
                sections.append([])  # the header rule: the body follows
                continue
            if len(sections) > 2 or not all(sections):
                return None
            rows = [_merge(row) for section in sections for row in section]
            if len(sections) == 2:  # the header: its rows are one row
                rows = [_merge([_merge(row) for row in sections[0]]), *rows[len(sections[0]):]]
            return rows, j
        if not line.strip():
            return None
        cells = _cells(line, starts)
        section = sections[-1]
        if not cells[0] and section:
            section[-1].append(cells)  # a continuation line of the row above
        else:
            section.append([cells])
    return None


def _pipe_row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _md_tables(lines: list[str]) -> list[str]:
    """Rewrite each reStructuredText simple table (``====  ===`` rules) as a Markdown
    pipe table, which the site renders as a table (a row's continuation lines, blank in
    the first column, are joined into it). A table this cannot parse is fenced as
    written."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        parsed = _parse_table(lines, i) if _TABLE_RULE.match(lines[i]) else None
        if parsed is None:
            out.append(lines[i])
            i += 1
            continue
        rows, end = parsed
        width = len(rows[0])
        out += ["", _pipe_row(rows[0]), "|" + "---|" * width]
        out += [_pipe_row(row) for row in rows[1:]]
        out.append("")
        i = end + 1
    return out


def rewrite(text: str) -> str:
    """Return ``text`` with roles as inline code, ``word::`` as ``word:`` and simple
    tables as Markdown tables."""
    text = _ROLE.sub(lambda m: f"`{_target_text(m.group(1))}`", text)
    text = _LITERAL_MARKER.sub(r"\1:", text)
    lines = [line for line in text.split("\n") if line.strip() != "::"]
    return "\n".join(_md_tables(lines))


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
