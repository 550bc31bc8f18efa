"""The start/stop/status commands every local service shares (:mod:`materializer.cli.local_service`),
on the stand-in service (:mod:`.stand_in`): only the address on stdout, a second start reports the
running one, status exits 1 when none runs, stop of none is a no-op."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import click
import pytest
from click.testing import CliRunner

from materializer.cli.local_service import LocalServiceCommands
from tests.unit.local.stand_in import StandInError, StandInService, kill_stand_ins_under

_COMMANDS = LocalServiceCommands(StandInService, "stand-in", "its output", address_name="address",
                                 describe=lambda service: f"running at {service.address}", stop_timeout_option=True)
group = _COMMANDS.group(help="Stand-in commands.")


@pytest.fixture(autouse=True)
def _no_stand_in_left(tmp_path: Path) -> Iterator[None]:
    yield
    kill_stand_ins_under(tmp_path)


@group.command()
@_COMMANDS.state_dir_option
@click.option("--fail", is_flag=True)
def start(state_dir: Path, fail: bool) -> None:
    """Start it."""
    def launch() -> StandInService:
        if fail:
            raise StandInError("no such runtime")
        return StandInService(state_dir).start(detach=True)
    _COMMANDS.start(state_dir, launch, lambda service: f"started (pid {service.pid})")


def test_start_status_stop(tmp_path: Path) -> None:
    runner = CliRunner()
    state_dir = str(tmp_path / "svc")
    assert runner.invoke(group, ["status", "--state-dir", state_dir]).exit_code == 1
    started = runner.invoke(group, ["start", "--state-dir", state_dir])
    try:
        assert started.exit_code == 0, started.output
        address = started.stdout.strip()
        assert address.startswith("127.0.0.1:") and "started (pid" in started.stderr
        again = runner.invoke(group, ["start", "--state-dir", state_dir])
        assert again.exit_code == 0 and again.stdout.strip() == address
        assert "stand-in already running (pid" in again.stderr
        status = runner.invoke(group, ["status", "--state-dir", state_dir])
        assert status.exit_code == 0 and status.stdout.strip() == f"running at {address}"
        as_json = runner.invoke(group, ["status", "--state-dir", state_dir, "--json"])
        assert json.loads(as_json.stdout)["address"] == address
    finally:
        stopped = runner.invoke(group, ["stop", "--state-dir", state_dir, "--timeout", "5"])
    assert stopped.exit_code == 0 and f"stand-in in {state_dir} stopped" in stopped.stderr
    status = runner.invoke(group, ["status", "--state-dir", state_dir])
    assert status.exit_code == 1 and f"no stand-in running in {state_dir}" in status.stderr
    assert not (tmp_path / "svc" / "stand-in.json").exists()


def test_stop_without_a_service_is_a_noop_and_a_failed_start_is_one_error_line(tmp_path: Path) -> None:
    runner = CliRunner()
    stopped = runner.invoke(group, ["stop", "--state-dir", str(tmp_path)])
    assert stopped.exit_code == 0 and "no stand-in running" in stopped.stderr
    failed = runner.invoke(group, ["start", "--state-dir", str(tmp_path), "--fail"])
    assert failed.exit_code == 2 and failed.stderr.strip() == "error: no such runtime" and failed.stdout == ""
