"""`warren users` on a stopped broker (users.json edited under the data dir's lock)
and on a running one (through its management API)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import start_broker
from pikahelp import can_login

from warren.cli import main as warren_main


def test_first_administrator_before_the_first_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(tmp_path / "data")
    assert (
        warren_main(["users", "-D", data, "add", "admin", "s3cret", "--tags", "administrator"]) == 0
    )
    assert (
        warren_main(["users", "-D", data, "set-permissions", "admin", "/", ".*", ".*", ".*"]) == 0
    )
    assert warren_main(["users", "-D", data, "add", "nobody", "pw"]) == 0
    out = capsys.readouterr().out
    assert 'Added user "admin".' in out
    assert 'Set permissions of user "admin" in vhost "/".' in out
    b = start_broker(tmp_path / "data")
    try:
        assert can_login(b, "admin", "s3cret")
        assert not can_login(b, "admin", "wrong")
        assert not can_login(b, "nobody", "pw")  # no permission on '/'
        assert b.call(lambda: b.broker.users.users["admin"].tags) == ["administrator"]
    finally:
        b.stop()


def test_change_password_and_delete_on_a_stopped_broker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = start_broker(tmp_path / "data")
    b.stop()  # a data dir a broker has used, now stopped
    data = str(tmp_path / "data")
    assert warren_main(["users", "-D", data, "change-password", "guest", "new-guest"]) == 0
    assert warren_main(["users", "-D", data, "change-password", "ghost", "x"]) == 1
    assert "no user 'ghost'" in capsys.readouterr().err
    assert (
        warren_main(["users", "-D", data, "set-permissions", "guest", "nowhere", "", "", ""]) == 1
    )
    assert "no vhost 'nowhere'" in capsys.readouterr().err
    assert warren_main(["users", "-D", data, "list"]) == 0
    assert capsys.readouterr().out.splitlines() == ["name   tags", "guest  administrator"]
    b = start_broker(tmp_path / "data")
    try:
        assert can_login(b, "guest", "new-guest") and not can_login(b, "guest", "guest")
    finally:
        b.stop()
    assert warren_main(["users", "-D", data, "delete", "guest"]) == 0
    b = start_broker(tmp_path / "data")
    try:
        assert b.call(lambda: "guest" not in b.broker.users.users)
    finally:
        b.stop()


def test_running_broker_goes_through_the_management_api(tmp_path: Path) -> None:
    b = start_broker(tmp_path / "data")
    try:
        http = b.broker.listener("http")
        assert http is not None
        ini = tmp_path / "warren.ini"
        ini.write_text(f"[main]\ndata_dir = {tmp_path / 'data'}\n[mgmt]\nport = {http.port}\n")
        assert warren_main(["users", "-c", str(ini), "add", "bob", "bobpw", "--tags", ""]) == 0
        assert (
            warren_main(["users", "-c", str(ini), "set-permissions", "bob", "/", ".*", ".*", ".*"])
            == 0
        )
        assert can_login(b, "bob", "bobpw")  # at once: the running broker made the change
        assert warren_main(["users", "-c", str(ini), "change-password", "bob", "bob2"]) == 0
        assert can_login(b, "bob", "bob2") and not can_login(b, "bob", "bobpw")
    finally:
        b.stop()


SESSION = [
    ["add", "alice", "pw", "--tags", "management"],
    ["set-tags", "alice", "monitoring,policymaker"],
    ["set-permissions", "alice", "/", ".*", ".*", ".*"],
    ["list"],
    ["clear-permissions", "alice", "/"],
    ["change-password", "alice", "pw2"],
    ["set-tags", "alice"],
    ["list"],
    ["delete", "alice"],
    ["list"],
]


def _session(where: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    printed = []
    for command in SESSION:
        assert warren_main(["users", *where, *command]) == 0, command
        printed.append(capsys.readouterr().out)
    return printed


def test_stopped_and_running_broker_print_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same commands print the same lines whether users.json or the API made the change."""
    stopped = _session(["-D", str(tmp_path / "stopped")], capsys)
    b = start_broker(tmp_path / "running")
    try:
        http = b.broker.listener("http")
        assert http is not None
        ini = tmp_path / "warren.ini"
        ini.write_text(f"[main]\ndata_dir = {tmp_path / 'running'}\n[mgmt]\nport = {http.port}\n")
        running = _session(["-c", str(ini)], capsys)
        assert warren_main(["users", "-c", str(ini), "delete", "ghost"]) == 1  # ctl's 5
    finally:
        b.stop()
    assert warren_main(["users", "-D", str(tmp_path / "stopped"), "delete", "ghost"]) == 1
    assert stopped == running
    assert stopped[0] == 'Added user "alice".\n'
    assert stopped[3] == "name   tags\nalice  monitoring,policymaker\nguest  administrator\n"
