"""``python -m consensus_lease.verify [options]``: the same as ``consensus-lease verify``."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.markup import escape

from ..errors import LeaseError
from . import command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m consensus_lease.verify")
    sub = parser.add_subparsers(dest="command", required=True)
    command.add_parser(sub)
    args = parser.parse_args([command.NAME, *(sys.argv[1:] if argv is None else argv)])
    console = Console() if sys.stdout.isatty() else Console(width=150)
    try:
        return command.run(args, console)
    except LeaseError as error:
        console.print(f"[red]error:[/] {type(error).__name__}: {escape(str(error))}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
