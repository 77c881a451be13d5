"""Code shape: no function or method in consensus_lease/ has more than 60 lines of code.

A function's lines of code run from its ``def`` line to its last line, less blank lines,
comment-only lines and docstrings (its own and those of the functions and classes nested in
it, whose lines count towards it). consensus_lease/bench/ and consensus_lease/verify/ (the
benchmark and verification tools, not the library) are exempt.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import consensus_lease

# The package under test: the checkout, or an installed wheel (scripts/check-wheel.sh).
PACKAGE = Path(consensus_lease.__file__).resolve().parent
EXEMPT = ("bench", "verify")  # directories under consensus_lease/
MAX_LINES_OF_CODE = 60

_NOT_CODE_TOKENS = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
    tokenize.ENCODING,
}
_Function = ast.FunctionDef | ast.AsyncFunctionDef


def code_lines(source: str, tree: ast.Module) -> set[int]:
    """Numbers (1-based) of the lines of ``source`` holding code: not blank, not only a
    comment, not part of a docstring."""
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE_TOKENS:
            lines.update(range(token.start[0], token.end[0] + 1))
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
                and first.end_lineno is not None
            ):
                lines.difference_update(range(first.lineno, first.end_lineno + 1))
    return lines


def function_sizes(source: str) -> list[tuple[str, int, int]]:
    """``(qualified name, def line, lines of code)`` of every function and method."""
    tree = ast.parse(source)
    code = code_lines(source, tree)
    sizes: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _Function | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if isinstance(child, _Function):
                    end = child.end_lineno or child.lineno
                    size = sum(1 for n in range(child.lineno, end + 1) if n in code)
                    sizes.append((name, child.lineno, size))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return sizes


def too_long(package: Path = PACKAGE) -> list[str]:
    """``path:line name: N lines of code`` for each function over the limit."""
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if relative.parts[0] in EXEMPT:
            continue
        for name, line, size in function_sizes(path.read_text(encoding="utf-8")):
            if size > MAX_LINES_OF_CODE:
                found.append(f"consensus_lease/{relative}:{line} {name}: {size} lines of code")
    return found


def test_no_function_has_more_than_60_lines_of_code() -> None:
    found = too_long()
    assert not found, (
        f"split these into functions of at most {MAX_LINES_OF_CODE} lines of code:\n"
        + "\n".join(found)
    )


SAMPLE = '''
"""Module docstring."""


def short(a: int) -> int:
    """One line of documentation,
    and a second."""
    # a comment-only line

    text = """a multi-line string
    is code"""
    return a + len(text)  # a trailing comment


class Holder:
    """Class docstring."""

    @property
    def value(self) -> int:
        def inner() -> int:
            """Nested docstring."""
            return 1

        return inner()
'''


def test_lines_of_code_leave_out_docstrings_comments_and_blank_lines() -> None:
    assert function_sizes(SAMPLE) == [
        ("short", 5, 4),  # def, the string's two lines, return
        ("Holder.value", 19, 4),  # def, def inner, return 1, return inner()
        ("Holder.value.inner", 20, 2),
    ]


def test_a_long_function_is_reported(tmp_path: Path) -> None:
    body = "".join(f"    x{n} = {n}\n" for n in range(MAX_LINES_OF_CODE))
    (tmp_path / "mod.py").write_text(f"def fits():\n{body[: body.rindex('    x')]}"
                                     f"\n\ndef over():\n{body}")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "tool.py").write_text(f"def exempt():\n{body}")
    assert too_long(tmp_path) == [
        f"consensus_lease/mod.py:{MAX_LINES_OF_CODE + 3} over: "
        f"{MAX_LINES_OF_CODE + 1} lines of code"
    ]
