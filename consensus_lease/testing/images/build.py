"""Build the container kit's images from the recipes shipped in this folder.

Each recipe is a folder next to this file: a ``Dockerfile`` built ``FROM`` a base
image given as the build argument ``BASE``, the files it copies, and ``packages``
(Debian packages, one a line). No registry is needed: the base is a Debian
``--variant=minbase`` root filesystem made by ``debootstrap`` from the mirror in this
machine's apt sources (``DEBIAN_MIRROR`` overrides) and loaded with ``docker
import``; it is tagged ``consensus-lease/rootfs:CODENAME-HASH`` and shared by every
recipe with the same packages. The Dockerfile is then built by the engine's classic
builder (no network inside the build).

==================== ========================================== ==================
recipe               image (default tag)                         style
==================== ========================================== ==================
etcd                 ``consensus-lease/etcd:3.4``               kit
zookeeper            ``consensus-lease/zookeeper:3.8``          kit
lookalike-etcd       ``consensus-lease-lookalike/etcd:3.4``     upstream
lookalike-zookeeper  ``consensus-lease-lookalike/zookeeper:3.8`` upstream
==================== ========================================== ==================

The look-alikes follow the conventions of etcd's published image and of the official
``zookeeper`` image, to prove the kit's upstream style where no registry is reachable.

Idempotent: an image is built only when missing or labelled with another recipe
revision or build arguments (``org.consensus-lease.recipe``, :meth:`Recipe.label`; bump
:attr:`Recipe.revision` when a recipe's result changes). Bases are built in parallel;
one build runs per host at a time (a lock file). Needs a running engine, and root plus
``debootstrap`` when a base is missing.

Run by ``consensus-lease kit build-images``, by ``docker/build-images.sh`` (as a plain
script, so no virtualenv is needed) and by the pytest plugin when images are missing.
Every failure raises :class:`BuildError` with what to do.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

if __package__:
    from .. import engine
else:  # run as a script (docker/build-images.sh): engine.py is standard library only
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import engine  # type: ignore[import-not-found, no-redef]

__all__ = [
    "RECIPES",
    "RECIPE_LABEL",
    "BuildError",
    "Recipe",
    "build_images",
    "main",
    "recipe_dir",
]

RECIPE_LABEL = "org.consensus-lease.recipe"
PACKAGES_LABEL = "org.consensus-lease.packages"
LOCK_PATH = Path("/var/lock/consensus-lease-build-images.lock")
LOCK_TIMEOUT_S = 900.0
DEBOOTSTRAP_TIMEOUT_S = 900.0
DOCKER_BUILD_TIMEOUT_S = 300.0


class BuildError(RuntimeError):
    """An image could not be built; the message says why (and the log tail)."""


@dataclass(frozen=True)
class Recipe:
    """One image: its folder here, the tag it gets, its revision, and the build arguments
    its Dockerfile takes besides ``BASE`` (names to values)."""

    name: str
    directory: str
    image: Callable[[], str]
    revision: int
    build_args: Callable[[], dict[str, str]] = dict

    def label(self) -> str:
        """The :data:`RECIPE_LABEL` value of its image: the revision, then each build
        argument (so a new value, e.g. of :data:`engine.ZOOKEEPER_HEAP_MB`, rebuilds)."""
        args = self.build_args()
        return ",".join([str(self.revision), *(f"{k}={args[k]}" for k in sorted(args))])

    def packages(self) -> list[str]:
        """The Debian packages of its base, from the folder's ``packages`` file."""
        text = (recipe_dir(self) / "packages").read_text()
        return [line.strip() for line in text.splitlines() if line.strip()]


RECIPES: dict[str, Recipe] = {
    recipe.name: recipe
    for recipe in (
        Recipe("etcd", "kit-etcd", lambda: engine.etcd_image(engine.KIT_STYLE), 1),
        Recipe(
            "zookeeper",
            "kit-zookeeper",
            lambda: engine.zookeeper_image(engine.KIT_STYLE),
            3,
            lambda: {"HEAP_MB": str(engine.ZOOKEEPER_HEAP_MB)},
        ),
        Recipe("lookalike-etcd", "lookalike-etcd", lambda: engine.LOOKALIKE_ETCD_IMAGE, 1),
        Recipe(
            "lookalike-zookeeper",
            "lookalike-zookeeper",
            lambda: engine.LOOKALIKE_ZOOKEEPER_IMAGE,
            1,
        ),
    )
}
"""Every recipe by name; ``etcd`` and ``zookeeper`` are the kit's default images (their
tags follow ``CONSENSUS_LEASE_ETCD_IMAGE`` / ``CONSENSUS_LEASE_ZOOKEEPER_IMAGE``)."""

KIT_RECIPES = ("etcd", "zookeeper")
LOOKALIKE_RECIPES = ("lookalike-etcd", "lookalike-zookeeper")


def recipe_dir(recipe: Recipe) -> Path:
    """The folder holding ``recipe``'s Dockerfile (inside the installed package)."""
    return Path(__file__).resolve().parent / recipe.directory


def _docker(*args: str, timeout_s: float = 120.0) -> str:
    try:
        done = subprocess.run(
            ["docker", *args], capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"docker {' '.join(args)}: {exc}") from exc
    if done.returncode != 0:
        raise BuildError(f"docker {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def _label(image: str, label: str) -> str | None:
    """The image's label value ("" if unlabelled), or None when the engine lacks the image."""
    quoted = urllib.parse.quote(image, safe="")
    status, body = engine.engine_request("GET", f"/images/{quoted}/json")
    if status == 404:
        return None
    if status != 200:
        raise BuildError(f"inspecting image {image}: HTTP {status}: {body[:200]!r}")
    labels = json.loads(body).get("Config", {}).get("Labels") or {}
    return str(labels.get(label, ""))


def _image_id(image: str) -> str | None:
    quoted = urllib.parse.quote(image, safe="")
    status, body = engine.engine_request("GET", f"/images/{quoted}/json")
    return str(json.loads(body)["Id"]) if status == 200 else None


def _codename() -> str:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError as exc:
        raise BuildError(f"cannot read /etc/os-release: {exc}") from exc
    found = re.search(r"^VERSION_CODENAME=\"?([a-z]+)\"?$", text, re.MULTILINE)
    if found is None:
        raise BuildError("no VERSION_CODENAME in /etc/os-release (is this Debian?)")
    return found.group(1)


def _mirror(codename: str, apt: Path = Path("/etc/apt")) -> str:
    """The first URI of an apt source (under ``apt``) carrying the release's own suite;
    ``$DEBIAN_MIRROR`` wins."""
    if os.environ.get("DEBIAN_MIRROR"):
        return os.environ["DEBIAN_MIRROR"]
    for path in sorted(apt.glob("sources.list.d/*.sources")):  # deb822 stanzas
        for stanza in re.split(r"\n\s*\n", path.read_text(errors="replace")):
            fields = {}
            for line in stanza.splitlines():
                key, sep, value = line.partition(":")
                if sep and not line.startswith((" ", "\t", "#")):
                    fields[key.strip().lower()] = value.split()
            if codename in fields.get("suites", []) and fields.get("uris"):
                return fields["uris"][0]
    for path in [apt / "sources.list", *sorted(apt.glob("sources.list.d/*.list"))]:
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            words = re.sub(r"\[[^]]*\]", "", line).split()  # drop [options]
            if len(words) >= 3 and words[0] == "deb" and words[2] == codename:
                return words[1]
    raise BuildError(
        f"no Debian mirror for suite {codename} in /etc/apt/sources.list*; set DEBIAN_MIRROR"
    )


def _base_tag(codename: str, packages: Sequence[str]) -> str:
    digest = hashlib.sha256(" ".join(sorted(packages)).encode()).hexdigest()[:12]
    return f"consensus-lease/rootfs:{codename}-{digest}"


def _build_base(tag: str, codename: str, packages: Sequence[str], log: list[str]) -> None:
    """debootstrap a minbase root filesystem with ``packages`` and import it as ``tag``."""
    if os.geteuid() != 0:
        raise BuildError(f"building the base {tag} runs debootstrap, which needs root")
    if shutil.which("debootstrap") is None:
        raise BuildError("debootstrap is missing (apt-get install -y debootstrap)")
    if shutil.which("docker") is None:
        raise BuildError("the docker client is missing (apt-get install -y docker.io)")
    mirror = _mirror(codename)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="consensus-lease-rootfs-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        command = [
            "debootstrap", "--variant=minbase", f"--include={','.join(packages)}",
            codename, str(rootfs), mirror,
        ]  # fmt: skip
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=DEBOOTSTRAP_TIMEOUT_S
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BuildError(f"{' '.join(command)}: {exc}") from exc
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
            raise BuildError(f"{' '.join(command)} failed:\n{tail}")
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (rootfs / cache).glob("*"):
                if item.is_file():
                    item.unlink()
        tar = subprocess.Popen(
            ["tar", "-C", str(rootfs), "--exclude=./proc/*", "--exclude=./sys/*",
             "--exclude=./dev/*", "-c", "."],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        try:
            imported = subprocess.run(
                ["docker", "import", "--change", f"LABEL {PACKAGES_LABEL}={','.join(packages)}",
                 "-", tag],
                stdin=tar.stdout, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
        finally:
            assert tar.stdout is not None
            tar.stdout.close()
            tar.wait(timeout=60)
        if imported.returncode != 0 or tar.returncode != 0:
            raise BuildError(f"docker import of {tag} failed: {imported.stderr.strip()}")
    took = time.monotonic() - started
    log.append(f"built base {tag} ({' '.join(packages)}) in {took:.0f} s")


def _context(directory: Path) -> bytes:
    """The recipe folder as a tar build context; files starting with ``#!`` are executable."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(directory.iterdir()):
            if not path.is_file():
                continue
            data = path.read_bytes()
            info = tarfile.TarInfo(path.name)
            info.size = len(data)
            info.mode = 0o755 if data.startswith(b"#!") else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _docker_build(recipe: Recipe, base: str, tag: str) -> None:
    query = urllib.parse.urlencode(
        {
            "t": tag,
            "buildargs": json.dumps({"BASE": base, **recipe.build_args()}),
            "labels": json.dumps({RECIPE_LABEL: recipe.label()}),
            "networkmode": "none",
            "rm": "1",
            "forcerm": "1",
        }
    )
    try:
        status, body = engine.engine_request(
            "POST",
            f"/build?{query}",
            body=_context(recipe_dir(recipe)),
            headers={"Content-Type": "application/x-tar"},
            timeout_s=DOCKER_BUILD_TIMEOUT_S,
        )
    except OSError as exc:
        raise BuildError(f"building {tag}: the engine did not answer: {exc}") from exc
    lines = []
    error = None if status == 200 else f"HTTP {status}"
    for raw in body.decode(errors="replace").splitlines():
        try:
            item = json.loads(raw)
        except ValueError:
            continue
        if "error" in item:
            error = str(item["error"]).strip()
        lines.extend(str(item.get("stream", "")).splitlines())
    if error is not None:
        tail = "\n".join(lines[-20:])
        raise BuildError(f"docker build of {tag} ({recipe_dir(recipe)}) failed: {error}\n{tail}")


class _HostLock:
    """One build per host at a time (two test sessions may both find an image missing)."""

    def __init__(self, timeout_s: float) -> None:
        path = LOCK_PATH if os.access(LOCK_PATH.parent, os.W_OK) else (
            Path(tempfile.gettempdir()) / LOCK_PATH.name
        )
        self._file = path.open("a")
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    self._file.close()
                    raise BuildError(
                        f"another image build held {path} for {timeout_s:.0f} s"
                    ) from None
                time.sleep(1.0)  # poll the lock until the deadline

    def release(self) -> None:
        self._file.close()


def _build_bases(
    needed: dict[str, list[str]], codename: str, report: Callable[[str], None]
) -> list[str]:
    """Build the bases ``needed`` (tag -> packages) two at a time; return the errors."""
    errors: list[str] = []
    log: list[str] = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [
            pool.submit(_build_base, tag, codename, packages, log)
            for tag, packages in needed.items()
        ]
        for future in futures:
            try:
                future.result()
            except BuildError as exc:
                errors.append(str(exc))
    for line in log:
        report(line)
    return errors


def _build_recipe(recipe: Recipe, base: str, report: Callable[[str], None]) -> None:
    """Build ``recipe`` on ``base`` and drop the image its tag pointed at before."""
    tag = recipe.image()
    if _image_id(base) is None:
        raise BuildError(f"{tag}: its base {base} could not be built")
    old = _image_id(tag)
    _docker_build(recipe, base, tag)
    new = _image_id(tag)
    if old is not None and old != new:
        try:  # a container still using the old image keeps it
            _docker("rmi", old)
        except BuildError:
            report(f"kept the old {tag} ({old[:19]}): in use")


def _outdated(names: list[str], force: bool, report: Callable[[str], None]) -> list[Recipe]:
    todo = []
    for name in names:
        recipe = RECIPES[name]
        if not force and _label(recipe.image(), RECIPE_LABEL) == recipe.label():
            report(f"{recipe.image()} is up to date")
        else:
            todo.append(recipe)
    return todo


def build_images(
    names: Iterable[str] = KIT_RECIPES,
    *,
    force: bool = False,
    report: Callable[[str], None] = print,
) -> dict[str, float]:
    """Build the images of the recipes ``names`` (see :data:`RECIPES`) that are missing or
    outdated (all of them, bases included, with ``force``). Reports one line per image
    through ``report``.

    Returns the seconds each built image took (bases included), by image tag.

    Raises:
        BuildError: unknown recipe, no engine, not root or no debootstrap when a base is
            missing, no Debian mirror, or a build failed (the others still ran; every
            failure is in the message). Images built before the failure stay.
    """
    wanted = list(dict.fromkeys(names))
    unknown = [name for name in wanted if name not in RECIPES]
    if unknown:
        raise BuildError(f"unknown image recipe(s) {unknown}; choose from {', '.join(RECIPES)}")
    if not engine.engine_answers():
        raise BuildError(
            "no Docker engine answers on /var/run/docker.sock "
            "(start one: python -m consensus_lease.testing.engine, as root)"
        )
    lock = _HostLock(LOCK_TIMEOUT_S)
    try:
        started = time.monotonic()
        todo = _outdated(wanted, force, report)
        if not todo:
            return {}
        codename = _codename()
        bases = {r.name: _base_tag(codename, r.packages()) for r in todo}
        needed = {
            bases[r.name]: r.packages()
            for r in todo
            if force or _label(bases[r.name], PACKAGES_LABEL) is None
        }
        errors = _build_bases(needed, codename, report)
        took: dict[str, float] = {}
        for recipe in todo:
            try:
                _build_recipe(recipe, bases[recipe.name], report)
            except BuildError as exc:
                errors.append(str(exc))
                continue
            took[recipe.image()] = time.monotonic() - started
            report(f"built {recipe.image()} in {took[recipe.image()]:.0f} s")
        if errors:
            raise BuildError("\n".join(errors))
        return took
    finally:
        lock.release()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``build-images`` (shared by the CLI and this script)."""
    parser.add_argument(
        "recipes", nargs="*", metavar="RECIPE",
        help=f"which images: {', '.join(RECIPES)}, 'kit' (the default: "
        f"{' and '.join(KIT_RECIPES)}), 'lookalike' or 'all'",
    )  # fmt: skip
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")


def chosen_recipes(args: argparse.Namespace) -> list[str]:
    """The recipe names the parsed ``build-images`` arguments ask for."""
    groups = {"kit": KIT_RECIPES, "lookalike": LOOKALIKE_RECIPES, "all": tuple(RECIPES)}
    names: list[str] = []
    for word in args.recipes or ["kit"]:
        names.extend(groups.get(word, (word,)))
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="build-images", description="Build the consensus_lease container kit's images."
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        build_images(chosen_recipes(args), force=args.force)
    except BuildError as exc:
        print(f"build-images: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
