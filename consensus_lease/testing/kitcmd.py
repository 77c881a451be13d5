"""``consensus-lease kit``: the container test kit's tools. Registered through
``cli.EXTRA_COMMANDS``.

``consensus-lease kit build-images [RECIPE ...] [--force]`` builds the kit's images
from the recipes shipped in the package (:mod:`consensus_lease.testing.images`), so an
installed wheel needs no source checkout; ``lookalike`` builds the images that follow
the upstream etcd and ``zookeeper`` images' conventions.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["NAME", "add_parser", "run"]

NAME = "kit"


def add_parser(subparsers: Any) -> None:
    from .images import build

    parser = subparsers.add_parser(
        NAME,
        help="the container test kit: build its images",
        description="Tools of the container test kit (consensus_lease.testing.cluster).",
    )
    sub = parser.add_subparsers(dest="kit_command", required=True)
    images = sub.add_parser(
        "build-images",
        help="build the cluster images from the recipes in the package",
        description="Build the kit's etcd and ZooKeeper images without a registry: "
        "a Debian minbase root filesystem (debootstrap, needs root) and the recipe's "
        "Dockerfile. Images already built by the same recipe revision are kept.",
    )
    build.add_arguments(images)


def run(args: argparse.Namespace, console: Any) -> int:
    from .images import build

    try:
        build.build_images(build.chosen_recipes(args), force=args.force, report=console.print)
    except build.BuildError as exc:
        from rich.markup import escape

        console.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        return 1
    return 0
