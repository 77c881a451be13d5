"""``python -m consensus_lease.bench [options]``: the same as ``consensus-lease bench``."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from . import command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m consensus_lease.bench")
    sub = parser.add_subparsers(dest="command", required=True)
    command.add_parser(sub)
    args = parser.parse_args([command.NAME, *(sys.argv[1:] if argv is None else argv)])
    console = Console() if sys.stdout.isatty() else Console(width=150)
    return command.run(args, console)


if __name__ == "__main__":
    sys.exit(main())
