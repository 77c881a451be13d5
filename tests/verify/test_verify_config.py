"""``VerifyConfig`` and ``LockSetConfig`` (the Python API of ``consensus-lease verify``)
check every field's type and range: ``InvalidArgument`` naming the field, never a raw
``TypeError`` or a bool taken for an int; and the command's help and messages say what
the code does."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from consensus_lease import InvalidArgument, UnsupportedOperation
from consensus_lease.verify import command
from consensus_lease.verify.lockset import LockSetConfig
from consensus_lease.verify.queue_worker import GRACE_S
from consensus_lease.verify.runner import VerifyConfig, run_verify
from consensus_lease.worker import command as worker_command

NAN, INF = float("nan"), float("inf")

BAD: list[tuple[str, Any]] = [
    ("backend", 3), ("backend", ""), ("backend", b"sqlite:///x"),
    ("cluster", "mysql"), ("cluster", 3),
    ("workers", True), ("workers", 0), ("workers", 33), ("workers", 2.0), ("workers", "4"),
    ("jobs", True), ("jobs", 2.5), ("jobs", 0), ("jobs", "3"), ("jobs", None),
    ("steps", "3"), ("steps", True), ("steps", 0), ("steps", 1.0),
    ("ttl_s", True), ("ttl_s", 0), ("ttl_s", -1.0), ("ttl_s", NAN), ("ttl_s", INF),
    ("ttl_s", "1"), ("ttl_s", 10**400),
    ("duration_s", True), ("duration_s", -1.0), ("duration_s", INF), ("duration_s", NAN),
    ("duration_s", None),
    ("quiet_s", False), ("quiet_s", -0.5), ("quiet_s", "20"),
    ("seed", True), ("seed", 1.5), ("seed", "7"), ("seed", None),
    ("faults", "pause"), ("faults", ("meteor",)), ("faults", (1,)), ("faults", None),
    ("history", 3), ("history", ""),
    ("destination", 3), ("destination", ""),
    ("unfenced", 1), ("unfenced", "no"),
    ("think_s", True), ("think_s", -1.0), ("think_s", NAN), ("think_s", "0.1"),
    ("renew_probability", True), ("renew_probability", 1.5), ("renew_probability", -0.1),
    ("renew_probability", "0.3"), ("renew_probability", NAN),
    ("run_dir", 3), ("run_dir", ""),
    ("until_done", 1), ("until_done", None),
    ("runner", 1), ("runner", "yes"),
    ("prefetch", True), ("prefetch", 1.0), ("complete_batch", True),
    ("complete_flush_s", True), ("complete_flush_s", "0.1"), ("complete_flush_s", NAN),
]


def _config(**fields: Any) -> VerifyConfig:
    base: dict[str, Any] = {"faults": ("pause-at-check",), "duration_s": 30.0}
    if fields.keys() & {"prefetch", "complete_batch", "complete_flush_s"}:
        base["runner"] = True
    return VerifyConfig(**{**base, **fields})


@pytest.mark.parametrize(("field", "value"), BAD, ids=[f"{f}={v!r}" for f, v in BAD])
def test_a_bad_field_is_refused_by_name(field: str, value: Any) -> None:
    config = _config(**{field: value})
    with pytest.raises(InvalidArgument, match=rf"^{field}\b"):
        config.validate()
    assert getattr(config, field) is value  # nothing changed


def test_every_field_has_a_bad_value_above() -> None:
    fields = set(VerifyConfig.__dataclass_fields__)
    assert {field for field, _ in BAD} == fields


@pytest.mark.parametrize("fields", [
    {}, {"ttl_s": 1, "duration_s": 30, "quiet_s": 0}, {"seed": -5}, {"think_s": 0},
    {"think_s": None}, {"renew_probability": 0}, {"renew_probability": 1},
    {"faults": ["pause-at-check"]}, {"faults": ()}, {"backend": "sqlite:///x.db"},
    {"destination": "sqlite:///d.db"}, {"unfenced": True, "until_done": True},
    {"run_dir": Path("r"), "history": Path("h.jsonl")}, {"run_dir": "r", "history": "h"},
    {"cluster": "etcd", "backend": None}, {"workers": 32, "jobs": 1, "steps": 1},
    {"runner": True, "prefetch": 4, "complete_batch": 8, "complete_flush_s": 0},
])
def test_good_fields_are_taken(fields: dict[str, Any]) -> None:
    _config(**fields).validate()


LOCK_SET_BAD: list[tuple[str, Any]] = [
    ("backend", 3), ("cluster", "mysql"), ("destination", ""), ("history", 3),
    ("run_dir", ""),
    ("workers", True), ("workers", 0), ("workers", 33), ("workers", 2.5), ("workers", "5"),
    ("seed", True), ("seed", "1"),
    ("ttl_s", True), ("ttl_s", 0), ("ttl_s", NAN), ("ttl_s", "2"),
    ("duration_s", True), ("duration_s", -1.0), ("duration_s", INF), ("duration_s", "90"),
    ("pause_every_s", True), ("pause_every_s", 0), ("pause_every_s", INF),
    ("pause_min_s", True), ("pause_min_s", "3"), ("pause_min_s", 0),
    ("pause_max_s", True), ("pause_max_s", NAN), ("pause_max_s", 2.0),
    ("pause_target", "any"), ("pause_target", 1),
    ("mode", "unfenced"), ("mode", None),
    ("think_s", True), ("think_s", -0.1), ("think_s", "0.02"),
]


@pytest.mark.parametrize(("field", "value"), LOCK_SET_BAD,
                         ids=[f"{f}={v!r}" for f, v in LOCK_SET_BAD])
def test_a_bad_lock_set_field_is_refused_by_name(field: str, value: Any) -> None:
    config = LockSetConfig(**{field: value})
    with pytest.raises(InvalidArgument, match=rf"\b{field}\b"):
        config.validate()


def test_every_lock_set_field_has_a_bad_value_above() -> None:
    assert {field for field, _ in LOCK_SET_BAD} == set(LockSetConfig.__dataclass_fields__)
    LockSetConfig().validate()
    LockSetConfig(ttl_s=1, pause_min_s=2, pause_max_s=2, think_s=0, seed=-1,
                  run_dir=Path("r"), pause_target="holder", mode="write-only").validate()


def _help(add_parser: Any, name: str) -> str:
    """The subcommand's ``--help``, its line breaks turned into spaces."""
    parser = argparse.ArgumentParser()
    sub: argparse.ArgumentParser = add_parser(parser.add_subparsers())
    assert sub.prog.endswith(name)
    return " ".join(sub.format_help().split())


def test_the_prefetch_help_names_each_command_s_own_grace() -> None:
    verify = _help(command.add_parser, "verify")
    assert "--grace-s" not in verify, verify  # verify has no such flag
    assert (f"within the runner's {GRACE_S:g} s grace period once the verifier stops the "
            "workers") in verify, verify
    worker = _help(worker_command.add_parser, "worker")
    assert "held until worked (also after a stop request, within --grace-s;" in worker
    assert "--grace-s S" in worker


def test_the_run_dir_help_says_a_used_one_is_refused() -> None:
    text = _help(command.add_parser, "verify")
    assert "a new or empty directory" in text and "is refused, exit status 2" in text, text


def test_a_store_of_one_process_is_refused_naming_every_shared_store(tmp_path: Path) -> None:
    config = VerifyConfig(backend="memory://", workers=1, jobs=1, steps=1, duration_s=0.0,
                          quiet_s=0.0, faults=(), run_dir=str(tmp_path / "run"))
    with pytest.raises(UnsupportedOperation) as refused:
        run_verify(config)
    text = str(refused.value)
    for scheme in ("sqlite:///", "postgresql://", "etcd://", "zk://"):
        assert scheme in text, text


def test_the_lock_set_docstring_lists_every_option_it_refuses() -> None:
    doc = " ".join((command.lockset_config_from_args.__doc__ or "").split())
    refused = [*command._JOB_ONLY.values(), "--unfenced", "--until-done"]
    assert "--runner" in refused and "--prefetch" in refused
    for flag in refused:
        assert f"``{flag}``" in doc, (flag, doc)
        parser = argparse.ArgumentParser()
        command.add_parser(parser.add_subparsers())
        value = {"--faults": ["pause"], "--runner": [], "--unfenced": [],
                 "--until-done": []}.get(flag, ["1"])
        args = parser.parse_args(["verify", "--workload", "lock-set", flag, *value])
        with pytest.raises(InvalidArgument, match=flag):
            command.lockset_config_from_args(args)


def test_a_failed_setup_leaves_the_run_dir_usable_again(tmp_path: Path) -> None:
    """A setup that fails (a store of one process, refused) removes what it put in the run
    directory: the same --run-dir then gives the same refusal, not "already holds a run's
    files"; a directory the caller made is kept, with the caller's own files."""
    for run_dir, made in ((tmp_path / "new", False), (tmp_path / "mine", True)):
        if made:
            run_dir.mkdir()
            (run_dir / "notes.txt").write_text("the caller's")
        config = VerifyConfig(backend="memory://", workers=1, jobs=1, steps=1,
                              duration_s=0.0, quiet_s=0.0, faults=(), run_dir=str(run_dir))
        for _ in range(2):
            with pytest.raises(UnsupportedOperation):
                run_verify(config)
        if made:
            assert sorted(p.name for p in run_dir.iterdir()) == ["notes.txt"]
        else:
            assert not run_dir.exists()


def test_a_failed_setup_removes_the_parents_it_made_and_refuses_odd_paths(
        tmp_path: Path) -> None:
    """A run dir several levels below anything that exists: a failed setup removes every
    level it made. A dangling symlink is refused by name (InvalidArgument), not with a raw
    FileExistsError. A TTL the store refuses is refused before the store (here a SQLite
    file named inside the run dir) is created, so the same run dir works afterwards."""
    deep = tmp_path / "n1" / "b" / "c"
    config = VerifyConfig(backend="memory://", workers=1, jobs=1, steps=1, duration_s=0.0,
                          quiet_s=0.0, faults=(), run_dir=str(deep))
    with pytest.raises(UnsupportedOperation):
        run_verify(config)
    assert list(tmp_path.iterdir()) == []
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing")
    config = VerifyConfig(workers=1, jobs=1, steps=1, duration_s=0.0, quiet_s=0.0,
                          faults=(), run_dir=str(link))
    with pytest.raises(InvalidArgument, match="dangling symlink"):
        run_verify(config)
    run_dir = tmp_path / "rd"
    store = run_dir / "store.db"
    config = VerifyConfig(backend=f"sqlite:///{store}", ttl_s=0.001, workers=1, jobs=1,
                          steps=1, duration_s=0.0, quiet_s=0.0, faults=(), run_dir=str(run_dir))
    with pytest.raises(InvalidArgument, match="--ttl-s"):
        run_verify(config)
    assert not run_dir.exists() and not store.exists()
