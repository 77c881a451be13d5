"""The worker tests' fixture: start ``consensus-lease worker`` processes, and kill
whatever is left of them afterwards."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from worker_kit import WorkerCommand


@pytest.fixture
def worker_command(tmp_path: Path) -> Iterator[Callable[..., WorkerCommand]]:
    started: list[WorkerCommand] = []

    def start(*args: str, env: dict[str, str] | None = None) -> WorkerCommand:
        command = WorkerCommand(tmp_path, list(args), env)
        started.append(command)
        return command

    yield start
    for command in started:
        command.stop()
