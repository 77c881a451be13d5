"""Image styles and image recipes, without an engine: what each style asks of its image
(command, environment, user) and how the recipes are found and packed."""

from __future__ import annotations

import argparse
import tarfile
from io import BytesIO
from pathlib import Path

import pytest

from consensus_lease import cli
from consensus_lease.testing import engine
from consensus_lease.testing.cluster import EtcdCluster, Member, ZooKeeperCluster
from consensus_lease.testing.images import build


@pytest.fixture(autouse=True)
def _no_image_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (engine.IMAGE_STYLE_ENV, engine.ETCD_IMAGE_ENV, engine.ZOOKEEPER_IMAGE_ENV):
        monkeypatch.delenv(name, raising=False)


def members(base: int) -> list[Member]:
    return [
        Member(name=f"m{n}", index=n, address=f"127.0.0.{base + n}", client_port=2181,
               gid=4300 + base + n)
        for n in (1, 2, 3)
    ]  # fmt: skip


def test_style_defaults_and_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    assert engine.image_style() == "kit"
    assert engine.etcd_image() == "consensus-lease/etcd:3.4"
    assert engine.zookeeper_image("upstream") == "zookeeper:3.8"
    monkeypatch.setenv(engine.IMAGE_STYLE_ENV, "Upstream")
    assert engine.image_style() == "upstream"
    assert engine.etcd_image() == engine.UPSTREAM_ETCD_IMAGE
    assert engine.etcd_image("kit") == engine.DEFAULT_ETCD_IMAGE  # an explicit style wins
    monkeypatch.setenv(engine.ZOOKEEPER_IMAGE_ENV, "mine/zk:1")
    assert engine.zookeeper_image() == "mine/zk:1"
    with pytest.raises(ValueError, match="unknown image style 'docker'"):
        engine.image_style("docker")
    with pytest.raises(ValueError, match="unknown image style"):
        EtcdCluster(image_style="docker")


def test_etcd_upstream_command_is_the_binary_then_the_same_flags() -> None:
    kit, upstream = EtcdCluster(), EtcdCluster(image_style="upstream")
    assert (kit.image, upstream.image) == (engine.DEFAULT_ETCD_IMAGE, engine.UPSTREAM_ETCD_IMAGE)
    for cluster in (kit, upstream):
        cluster.members = members(10)
    kit_command = kit._command(kit.members[0])
    upstream_command = upstream._command(upstream.members[0])
    assert kit_command is not None and kit_command[0] == "--name"
    assert upstream_command == ["/usr/local/bin/etcd", *kit_command]
    assert upstream._user(upstream.members[0]) == kit._user(kit.members[0]) == "0:4311"


def test_zookeeper_upstream_is_configured_by_zoo_variables_only() -> None:
    cluster = ZooKeeperCluster(image_style="upstream", tick_ms=300, heap_mb=128,
                               extra_config={"jute.maxbuffer": "2000000"})  # fmt: skip
    cluster.members = members(20)
    second = cluster.members[1]
    assert cluster._command(second) is None  # the image's entrypoint and command
    assert cluster._user(second) == "zookeeper:4322"  # not root: the entrypoint keeps the gid
    env = cluster._env(second)
    assert env["ZOO_MY_ID"] == "2"
    assert env["ZOO_SERVERS"] == " ".join(
        f"server.{n}=127.0.0.{20 + n}:2888:3888;127.0.0.{20 + n}:2181" for n in (1, 2, 3)
    )
    assert (env["ZOO_TICK_TIME"], env["ZOO_INIT_LIMIT"], env["ZOO_SYNC_LIMIT"]) == (
        "300", "20", "6",
    )  # fmt: skip
    assert env["ZOO_STANDALONE_ENABLED"] == env["ZOO_ADMINSERVER_ENABLED"] == "false"
    assert env["ZOO_4LW_COMMANDS_WHITELIST"] == "srvr,mntr,ruok"
    assert env["ZOO_CFG_EXTRA"].split() == [
        "maxSessionTimeout=60000", "cnxTimeout=1000", "jute.maxbuffer=2000000",
    ]  # fmt: skip
    assert "-Xmx128m" in env["JVMFLAGS"] and env["ZK_SERVER_HEAP"] == "128"


def test_zookeeper_kit_style_keeps_the_zk_member_protocol() -> None:
    cluster = ZooKeeperCluster()
    cluster.members = members(20)
    command = cluster._command(cluster.members[0])
    assert command is not None and command[0] == "1" and "clientPortAddress=127.0.0.21" in command
    assert cluster._user(cluster.members[0]) == "0:4321"
    assert set(cluster._env(cluster.members[0])) == {"JVMFLAGS"}


def test_zookeeper_upstream_refuses_config_with_blanks() -> None:
    with pytest.raises(ValueError, match="ZOO_CFG_EXTRA"):
        ZooKeeperCluster(image_style="upstream", extra_config={"a": "b c"})
    ZooKeeperCluster(extra_config={"a": "b c"})  # zk-member passes each line whole


def test_every_recipe_is_shipped_complete() -> None:
    assert set(build.RECIPES) == {*build.KIT_RECIPES, *build.LOOKALIKE_RECIPES}
    for recipe in build.RECIPES.values():
        folder = build.recipe_dir(recipe)
        dockerfile = (folder / "Dockerfile").read_text()
        assert "ARG BASE\nFROM ${BASE}\n" in dockerfile, recipe.name
        assert recipe.packages(), recipe.name
        for line in dockerfile.splitlines():  # every file it copies is in the folder
            if line.startswith("COPY "):
                assert (folder / line.split()[1]).is_file(), line


def test_build_context_makes_scripts_executable() -> None:
    context = build._context(build.recipe_dir(build.RECIPES["lookalike-zookeeper"]))
    with tarfile.open(fileobj=BytesIO(context)) as tar:
        modes = {member.name: member.mode for member in tar.getmembers()}
    assert modes["docker-entrypoint.sh"] == modes["zkServer.sh"] == 0o755
    assert modes["Dockerfile"] == modes["packages"] == 0o644


def test_mirror_from_deb822_or_one_line_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DEBIAN_MIRROR", raising=False)
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text(
        "# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://one.example/debian bookworm main\n"
    )
    assert build._mirror("bookworm", tmp_path) == "http://one.example/debian"
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://sec.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://deb.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\n"
    )
    assert build._mirror("bookworm", tmp_path) == "http://deb.example/debian"
    with pytest.raises(build.BuildError, match="no Debian mirror for suite trixie"):
        build._mirror("trixie", tmp_path)
    monkeypatch.setenv("DEBIAN_MIRROR", "http://mine.example/debian")
    assert build._mirror("trixie", tmp_path) == "http://mine.example/debian"


def test_recipe_groups_and_unknown_recipes() -> None:
    def chosen(*words: str) -> list[str]:
        return build.chosen_recipes(argparse.Namespace(recipes=list(words)))

    assert chosen() == ["etcd", "zookeeper"]
    assert chosen("lookalike", "etcd") == ["lookalike-etcd", "lookalike-zookeeper", "etcd"]
    assert len(chosen("all")) == 4
    with pytest.raises(build.BuildError, match=r"unknown image recipe\(s\) \['nope'\]"):
        build.build_images(["nope"])


def test_cli_kit_build_images_reports_a_bad_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["kit", "build-images", "nope"]) == 1
    assert "unknown image recipe(s) ['nope']" in capsys.readouterr().out
