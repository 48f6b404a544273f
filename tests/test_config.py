"""turnd.toml: parsing, one-line errors naming the key, env overrides, paths, secrets, reload."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daemon.accounts import ensure_credentials, local_did
from daemon.config import load_config
from daemon.config_file import ConfigError, parse_listen
from daemon.dids import account_did
from daemon.echo import ECHO_LABEL
from daemon.reload import SettingsReloader

TURND = str(Path(sys.executable).parent / "turnd")
PROVIDER_KEYS = ("OPENAI_API_KEY", "OPENROUTER_API_KEY")


def write(tmp: Path, text: str, name: str = "turnd.toml") -> Path:
    path = tmp / name
    path.write_text(text)
    return path


def error_of(path: Path | None, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, env=env or {})
    message = str(info.value)
    assert "\n" not in message
    return message


def clean_env(**extra: str) -> dict[str, str]:
    """The process env without provider keys or TURND_* (the host's must not leak in)."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("TURND_") and k not in PROVIDER_KEYS
    }
    env.update(extra)
    return env


# -- parsing and defaults -----------------------------------------------------------------


def test_minimal_file_gets_the_spec_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""), env={})
    assert config.store_kind == "local"
    assert config.store_path == tmp_path / "turnd-data"
    assert config.state_path == tmp_path / "turnd-data" / "state.sqlite3"
    assert (config.host, config.port) == ("127.0.0.1", 8787)
    assert config.cors_origins == [] and config.web is True
    assert config.default_model == "echo:echo"
    echo = config.providers["echo"]
    assert echo.base_url == "http://127.0.0.1:8787/echo/v1"
    assert echo.label == ECHO_LABEL
    assert config.turns.max_steps == 8 and config.turns.rate_per_minute == 10
    assert config.accounts == []


def test_the_spec_example_parses(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[store]
kind = "local"
path = "turnd-data"
[http]
listen = "0.0.0.0:9000"
cors_origins = ["https://chat.example.com"]
[models]
default = "openai:gpt-4o-mini"
[turns]
ratePerMinute = 10
maxSteps = 4
timeoutSeconds = 600
backfillMinutes = 60
maxParallelTools = 5
toolTimeoutSeconds = 30
systemPrompt = "You are {{appName}}"
[providers.openai]
base_url = "https://api.openai.com/v1/"
api_key_env = "OPENAI_API_KEY"
models = ["gpt-4o-mini"]
[accounts.me]
handle = "me.test"
password_env = "TURND_ME_PASSWORD"
token_env = "TURND_ME_TOKEN"
tools = ["clock_now"]
[plugins]
enabled = ["clock"]
""",
    )
    env = {"OPENAI_API_KEY": "sk-abc", "TURND_ME_PASSWORD": "pw-1", "TURND_ME_TOKEN": "tok-1"}
    config = load_config(path, env=env)
    assert config.turns.max_steps == 4 and config.turns.system_prompt == "You are {{appName}}"
    openai = config.providers["openai"]
    assert openai.base_url == "https://api.openai.com/v1" and openai.api_key == "sk-abc"
    assert openai.models == ("gpt-4o-mini",)
    # A wildcard bind is reached over loopback: the echo URL must be dialable.
    assert config.providers["echo"].base_url == "http://127.0.0.1:9000/echo/v1"
    assert config.base_url == "http://127.0.0.1:9000"
    [me] = config.accounts
    assert (me.name, me.handle) == ("me", "me.test")
    assert me.did == load_config(path, env=env).accounts[0].did  # kept, not drawn again
    assert me.did != local_did("me.test")  # random, not derived from the handle
    assert (me.password, me.token) == ("pw-1", "tok-1")
    assert me.tools == ("clock_now",)
    assert config.plugins == ["clock"]
    assert config.cors_origins == ["https://chat.example.com"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[http]\nlisten = 8787\n", "http.listen:"),
        ('[http]\nlisten = "localhost"\n', "http.listen: expected host:port"),
        ('[http]\nlisten = "127.0.0.1:99999"\n', "http.listen: port 99999 out of range"),
        ('[http]\nlisen = "127.0.0.1:1"\n', "http.lisen: unknown key"),
        ("[htp]\nlisten = 1\n", "htp: unknown key"),
        ('[store]\nkind = "s3"\n', "store.kind:"),
        ('[store]\nkind = "pds"\n', "store.service: required"),
        ("[http]\nweb = 3\n", "http.web:"),
        ("[http]\nmax_body_bytes = 0\n", "http.max_body_bytes:"),
        ("[turns]\nmaxSteps = 0\n", "turns.maxSteps: must be >= 1"),
        ('[turns]\nmaxSteps = "many"\n', "turns.maxSteps: must be a number"),
        ("[turns]\nmaxStep = 3\n", "turns.maxStep: unknown setting"),
        ('[models]\ndefault = "gpt-4o"\n', 'models.default: expected "provider:id"'),
        ('[models]\ndefault = "nope:gpt-4o"\n', "models.default: unknown provider 'nope'"),
        ('[providers.echo]\nbase_url = "http://x/v1"\n', "providers.echo: the name is reserved"),
        ('[providers.x]\napi_key_env = "K"\n', "providers.x.base_url: required key is missing"),
        ('[providers.x]\nbase_url = "ftp://x"\n', "providers.x.base_url: must be an http(s) URL"),
        ('[providers.x]\nbase_url = "http://x"\nkey = "sk"\n', "providers.x.key: unknown key"),
        ("[accounts.me]\npassword_env = 'P'\n", "accounts.me.handle: required key is missing"),
        ("[plugins]\nenabled = 'clock'\n", "plugins.enabled:"),
    ],
)
def test_bad_values_are_one_line_naming_the_key(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in error_of(write(tmp_path, text), env={"P": "x"})


def test_toml_syntax_error_is_one_line(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, "[http\nlisten = \n"))
    assert "not valid TOML" in message and "turnd.toml" in message


def test_parse_listen_ipv6() -> None:
    assert parse_listen("[::1]:8787") == ("::1", 8787)
    with pytest.raises(ValueError):
        parse_listen("::1:8787")


# -- where the file comes from ------------------------------------------------------------


def test_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    assert "config file not found" in error_of(tmp_path / "nope.toml")


def test_turnd_config_env_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, '[http]\nlisten = "127.0.0.1:1234"\n', "elsewhere.toml")
    monkeypatch.chdir(tmp_path.parent)
    assert load_config(None, env={"TURND_CONFIG": str(path)}).port == 1234
    assert "config file not found" in error_of(None, env={"TURND_CONFIG": str(tmp_path / "x")})


def test_no_file_means_embedded_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(None, env={})
    assert config.path is None
    assert config.store_path == tmp_path / "turnd-data"
    assert config.default_model == "echo:echo"
    assert set(config.providers) == {"echo"}


def test_embedded_defaults_use_a_provider_key_from_the_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(None, env={"OPENAI_API_KEY": "sk-live"})
    assert config.default_model == "openai:gpt-4o-mini"
    assert config.providers["openai"].api_key == "sk-live"
    assert "echo" in config.providers  # still there, for tests and `--model echo:echo`


def test_a_local_file_wins_over_embedded_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, '[http]\nlisten = "127.0.0.1:4321"\n')
    monkeypatch.chdir(tmp_path)
    assert load_config(None, env={}).port == 4321


# -- environment overrides ----------------------------------------------------------------


def test_env_overrides_every_kind_of_value(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[http]
listen = "127.0.0.1:1"
[turns]
maxSteps = 3
[providers.my_llm]
base_url = "http://a/v1"
[accounts.me]
handle = "me.test"
""",
    )
    env = {
        "TURND_HTTP_LISTEN": "127.0.0.1:2",
        "TURND_HTTP_WEB": "false",
        "TURND_HTTP_CORS_ORIGINS": "https://a.example, https://b.example",
        "TURND_TURNS_MAXSTEPS": "5",
        "TURND_TURNS_TIMEOUTSECONDS": "1.5",
        "TURND_TURNS_SYSTEMPROMPT": "Be brief.",
        "TURND_STORE_PATH": "data2",
        "TURND_STATE_PATH": "/var/tmp/turnd-state.sqlite3",
        "TURND_PROVIDERS_MY_LLM_BASE_URL": "http://b/v1",
        "TURND_PROVIDERS_MY_LLM_MODELS": '["m1", "m2"]',
        "TURND_MODELS_DEFAULT": "my_llm:m1",
        "TURND_ACCOUNTS_ME_HANDLE": "other.test",
        "TURND_PLUGINS_ENABLED": "clock",
    }
    config = load_config(path, env=env)
    assert config.port == 2 and config.web is False
    assert config.cors_origins == ["https://a.example", "https://b.example"]
    assert config.turns.max_steps == 5 and config.turns.timeout_seconds == 1.5
    assert config.turns.system_prompt == "Be brief."
    assert config.store_path == tmp_path / "data2"  # relative to the config file
    assert config.state_path == Path("/var/tmp/turnd-state.sqlite3")
    assert config.providers["my_llm"].base_url == "http://b/v1"
    assert config.providers["my_llm"].models == ("m1", "m2")
    assert config.default_model == "my_llm:m1"
    assert config.accounts[0].handle == "other.test"
    assert config.accounts[0].did == account_did(config.store_path, "other.test")
    assert config.plugins == ["clock"]


def test_a_bad_env_override_names_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    assert "turns.maxSteps: must be a number" in error_of(path, {"TURND_TURNS_MAXSTEPS": "lots"})
    assert "http.listen: expected host:port" in error_of(path, {"TURND_HTTP_LISTEN": "nope"})
    assert "http.web:" in error_of(path, {"TURND_HTTP_WEB": "perhaps"})


def test_secret_variables_are_not_read_as_overrides(tmp_path: Path) -> None:
    # TURND_ME_PASSWORD looks like TURND_<TABLE>_<KEY> but names no table: ignored.
    path = write(
        tmp_path, "[accounts.me]\nhandle = 'me.test'\npassword_env = 'TURND_ME_PASSWORD'\n"
    )
    config = load_config(path, env={"TURND_ME_PASSWORD": "pw-secret"})
    assert config.accounts[0].password == "pw-secret"


# -- paths ----------------------------------------------------------------------------------


def test_relative_paths_are_relative_to_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    path = write(conf_dir, '[store]\npath = "data"\n[state]\npath = "run/state.db"\n')
    monkeypatch.chdir(tmp_path)  # the cwd must not matter
    config = load_config(Path("etc/turnd.toml"), env={})
    assert config.store_path == conf_dir / "data"
    assert config.state_path == conf_dir / "run" / "state.db"
    assert config.path == path


def test_state_defaults_beside_the_config_with_a_pds_store(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[store]
kind = "pds"
service = "http://localhost:2583"
[accounts.alice]
handle = "alice.test"
password_env = "ALICE_APP_PASSWORD"
""",
    )
    config = load_config(path, env={"ALICE_APP_PASSWORD": "app-pw"})
    assert config.state_path == tmp_path / "state.sqlite3"
    assert config.accounts[0].did is None  # resolved from the handle by the pds backend
    text = path.read_text().replace("password_env", "token_env")
    message = error_of(write(tmp_path, text), {"ALICE_APP_PASSWORD": "app-pw"})
    assert message.startswith("accounts.alice.password_env: required with a pds store")


# -- secrets ----------------------------------------------------------------------------------


# Three secrets, each read from the variable its *_env key names.
SECRETS = """
[providers.openai]
base_url = "https://api.openai.com/v1"
api_key_env = "MY_OPENAI_KEY"
[accounts.me]
handle = "me.test"
password_env = "ME_PW"
token_env = "ME_TOKEN"
"""


def test_secrets_come_only_from_the_named_env_vars(tmp_path: Path) -> None:
    path = write(tmp_path, SECRETS)
    env = {"MY_OPENAI_KEY": "sk-secret-1", "ME_PW": "pw-secret-2", "ME_TOKEN": "tok-secret-3"}
    config = load_config(path, env=env)
    assert config.providers["openai"].api_key == "sk-secret-1"
    assert sorted(config.secrets()) == sorted(env.values())
    # reprs (and so tracebacks and debug logs) never show them
    assert not any(s in repr(config) for s in env.values())


@pytest.mark.parametrize(
    ("missing", "key"),
    [
        ("MY_OPENAI_KEY", "providers.openai.api_key_env"),
        ("ME_PW", "accounts.me.password_env"),
        ("ME_TOKEN", "accounts.me.token_env"),
    ],
)
def test_a_missing_secret_names_the_key_and_the_variable(
    tmp_path: Path, missing: str, key: str
) -> None:
    path = write(tmp_path, SECRETS)
    env = {"MY_OPENAI_KEY": "sk-1", "ME_PW": "pw", "ME_TOKEN": "tok"}
    del env[missing]
    assert error_of(path, env) == f"{key}: environment variable {missing} is not set"


def test_secrets_in_the_file_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, '[providers.x]\nbase_url = "http://x/v1"\napi_key = "sk-inline"\n')
    assert error_of(path) == "providers.x.api_key: unknown key (did you mean `api_key_env`?)"
    path = write(tmp_path, '[accounts.me]\nhandle = "me.test"\npassword = "inline"\n')
    assert error_of(path) == "accounts.me.password: unknown key (did you mean `password_env`?)"


def test_first_start_credentials_are_0600_and_made_once(tmp_path: Path) -> None:
    account, created = ensure_credentials(tmp_path / "data")
    assert created and account.did == account_did(tmp_path / "data", "me.test")
    assert len(account.token or "") >= 32 and len(account.password or "") >= 16
    mode = (tmp_path / "data" / "credentials.json").stat().st_mode & 0o777
    assert mode == 0o600
    again, created_again = ensure_credentials(tmp_path / "data")
    assert not created_again and again == account
    # and a config without [accounts] picks it up
    path = write(tmp_path, '[store]\npath = "data"\n')
    config = load_config(path, env={})
    assert config.accounts == [account] and config.generated_account


# -- [turns] reload -------------------------------------------------------------------------


class Clock:
    """A monotonic clock the test moves by hand (the reloader stats at most once a second)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_turns_settings_reload_when_the_file_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, "[turns]\nmaxSteps = 3\n")
    config = load_config(path, env={})
    assert isinstance(config.settings, SettingsReloader)
    assert config.settings().max_steps == 3
    clock = Clock()
    settings = SettingsReloader(path, config.settings(), {}, clock=clock)

    path.write_text("[turns]\nmaxSteps = 5\nratePerMinute = 2\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 5_000_000_000))
    # At most one stat a second: a turn starting right away still gets the old ones...
    assert settings().max_steps == 3
    clock.now += 0.9
    assert settings().max_steps == 3
    clock.now += 0.2
    # ...and the next turn after that gets the edit, without a restart.
    assert (settings().max_steps, settings().rate_per_minute) == (5, 2)

    # A broken edit is logged and the last good settings stay in force.
    path.write_text("[turns]\nmaxSteps = 0\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10_000_000_000))
    clock.now += 1.1
    with caplog.at_level(logging.ERROR, logger="turnd.config"):
        assert settings().max_steps == 5
    assert "turns.maxSteps" in caplog.text


def test_turns_reload_keeps_env_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, "[turns]\nmaxSteps = 3\n")
    env = {"TURND_TURNS_RATEPERMINUTE": "7"}
    config = load_config(path, env=env)
    clock = Clock()
    settings = SettingsReloader(path, config.settings(), env, clock=clock)
    path.write_text("[turns]\nmaxSteps = 4\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 5_000_000_000))
    clock.now += 1.1
    assert (settings().max_steps, settings().rate_per_minute) == (4, 7)


# -- through the real console script ----------------------------------------------------------


def run_turnd(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TURND, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("command", ["serve", "check", "send"])
def test_bad_config_exits_2_with_one_line(tmp_path: Path, command: str) -> None:
    write(tmp_path, '[http]\nlisen = "127.0.0.1:1"\n')
    args = [command, "--config", "turnd.toml"] + (["hi"] if command == "send" else [])
    result = run_turnd(*args, cwd=tmp_path, env=clean_env())
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "turnd: config error: http.lisen: unknown key (did you mean `listen`?)"
    ]
    assert not (tmp_path / "turnd-data").exists()  # nothing started


def test_missing_secret_exits_2_naming_key_and_variable(tmp_path: Path) -> None:
    write(tmp_path, "[accounts.me]\nhandle = 'me.test'\ntoken_env = 'TURND_ME_TOKEN'\n")
    result = run_turnd("serve", cwd=tmp_path, env=clean_env())
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "turnd: config error: accounts.me.token_env: environment variable TURND_ME_TOKEN is not set"
    )


def test_bad_env_override_exits_2(tmp_path: Path) -> None:
    result = run_turnd("serve", cwd=tmp_path, env=clean_env(TURND_TURNS_MAXSTEPS="-1"))
    assert result.returncode == 2
    assert result.stderr.strip() == "turnd: config error: turns.maxSteps: must be >= 1"


def test_unknown_plugin_is_a_config_error(tmp_path: Path) -> None:
    write(tmp_path, "[plugins]\nenabled = ['no-such-plugin']\n")
    result = run_turnd("serve", cwd=tmp_path, env=clean_env())
    assert result.returncode == 2
    assert result.stderr.startswith("turnd: config error: plugins.enabled:")
    assert len(result.stderr.strip().splitlines()) == 1


def test_env_overrides_apply_to_the_embedded_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(
        None, env={"TURND_STORE_PATH": "elsewhere", "TURND_HTTP_LISTEN": "127.0.0.1:9999"}
    )
    assert config.store_path == tmp_path / "elsewhere"
    assert config.providers["echo"].base_url == "http://127.0.0.1:9999/echo/v1"
