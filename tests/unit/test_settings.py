"""Tests for orchard.runtime.settings: defaults < env vars < flags, and clear errors."""

from __future__ import annotations

import os

import pydantic
import pytest
from pydantic_settings import SettingsConfigDict

from orchard.runtime import ServiceSettings, SettingsError, load_settings


class DemoSettings(ServiceSettings):
    """Settings of a demo service."""

    model_config = SettingsConfigDict(env_prefix="ORCHARD_DEMO_", extra="forbid")

    port: int = 50099
    """TCP port to listen on."""

    max_concurrent_execs: int = 8
    """How many execs may run at once."""

    keep_sandboxes: bool = False
    """Keep sandboxes after the service stops."""


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start every test without ORCHARD_DEMO_* variables from the outer environment."""
    for key in [k for k in os.environ if k.startswith("ORCHARD_DEMO_")]:
        monkeypatch.delenv(key)


def test_defaults() -> None:
    """With no env and no flags every field has its default."""
    settings = load_settings(DemoSettings, [])
    assert settings.model_dump() == {
        "host": "127.0.0.1",
        "port": 50099,
        "grace_period_s": 5.0,
        "log_level": "INFO",
        "log_format": "json",
        "auth_token": None,
        "auth_tokens_file": None,
        "max_message_bytes": 64 * 1024 * 1024,
        "metrics_port": None,
        "tls_cert_file": None,
        "tls_key_file": None,
        "tls_client_ca_file": None,
        "max_concurrent_execs": 8,
        "keep_sandboxes": False,
    }


def test_env_overrides_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """ORCHARD_<SERVICE>_<FIELD> env vars override defaults."""
    monkeypatch.setenv("ORCHARD_DEMO_GRACE_PERIOD_S", "0.5")
    monkeypatch.setenv("ORCHARD_DEMO_MAX_CONCURRENT_EXECS", "3")
    monkeypatch.setenv("ORCHARD_DEMO_KEEP_SANDBOXES", "true")
    monkeypatch.setenv("ORCHARD_DEMO_AUTH_TOKEN", "s3cret")
    settings = load_settings(DemoSettings, [])
    assert (settings.grace_period_s, settings.max_concurrent_execs, settings.keep_sandboxes) == (0.5, 3, True)
    assert settings.auth_token == "s3cret"
    assert "s3cret" not in repr(settings)


def test_flags_override_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flags beat env vars; bools take --flag / --no-flag."""
    monkeypatch.setenv("ORCHARD_DEMO_MAX_CONCURRENT_EXECS", "3")
    monkeypatch.setenv("ORCHARD_DEMO_KEEP_SANDBOXES", "true")
    monkeypatch.setenv("ORCHARD_DEMO_LOG_LEVEL", "warning")
    settings = load_settings(
        DemoSettings, ["--max-concurrent-execs", "5", "--no-keep-sandboxes", "--port", "0", "--log-format", "text"]
    )
    assert (settings.max_concurrent_execs, settings.keep_sandboxes, settings.port) == (5, False, 0)
    assert (settings.log_format, settings.log_level) == ("text", "WARNING")


def test_help_uses_field_docstrings(capsys: pytest.CaptureFixture[str]) -> None:
    """--help shows each field's docstring and env var."""
    with pytest.raises(SystemExit):
        load_settings(DemoSettings, ["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--max-concurrent-execs" in out
    assert "How many execs may run at once. (env ORCHARD_DEMO_MAX_CONCURRENT_EXECS; default 8)" in out
    assert "--keep-sandboxes, --no-keep-sandboxes" in out


@pytest.mark.parametrize(
    ("env", "argv", "expected"),
    [
        ({}, ["--grace-period-s", "soon"], "grace_period_s (env ORCHARD_DEMO_GRACE_PERIOD_S, flag --grace-period-s)"),
        ({"ORCHARD_DEMO_PORT": "70000"}, [], "port (env ORCHARD_DEMO_PORT, flag --port): Value error, must be between"),
        ({}, ["--log-level", "LOUD"], "log_level (env ORCHARD_DEMO_LOG_LEVEL, flag --log-level)"),
        ({}, ["--log-format", "xml"], "log_format (env ORCHARD_DEMO_LOG_FORMAT, flag --log-format)"),
        ({"ORCHARD_DEMO_MAX_CONCURRENT_EXECS": "many"}, [], "got 'many'"),
    ],
)
def test_bad_value_names_field_env_and_flag(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], argv: list[str], expected: str
) -> None:
    """An invalid value raises SettingsError naming the field, its env var and its flag."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError, match="invalid settings for DemoSettings") as info:
        load_settings(DemoSettings, argv)
    assert expected in str(info.value)


def test_bad_token_is_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rejected auth token is reported without its value."""
    monkeypatch.setenv("ORCHARD_DEMO_AUTH_TOKEN", "   ")
    with pytest.raises(SettingsError, match="auth_token .*must not be empty") as info:
        load_settings(DemoSettings, [])
    assert "got" not in str(info.value)


def test_extra_field_forbidden() -> None:
    """Unknown settings are rejected, in code and on the command line."""
    with pytest.raises(pydantic.ValidationError, match="Extra inputs are not permitted"):
        DemoSettings(max_execs=3)  # type: ignore[call-arg]
    with pytest.raises(SystemExit):
        load_settings(DemoSettings, ["--max-execs", "3"])
