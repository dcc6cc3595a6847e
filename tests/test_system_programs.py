"""A missing system program fails the test in CI and skips it elsewhere."""

from __future__ import annotations

import pytest

from tests import system_programs
from tests.system_programs import program


def test_a_missing_program_fails_in_ci_and_skips_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system_programs, "which", lambda _name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="chromium is not installed"):
        program("chromium")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="redis-server is not installed"):
        program("redis-server")


def test_an_installed_program_is_its_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system_programs, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setenv("CI", "true")
    assert program("nginx") == "/usr/bin/nginx"
