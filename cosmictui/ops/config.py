"""Settings for one deployment: which `.env`, which commands, where the relay lives.

Every command the wizard runs is configurable because deployments differ; the defaults
are the ones on the operator page (`set-up-a-relay.txt`). Settings come from a TOML file
(`--config`, else `~/.config/cosmictui/config.toml` when present) and then overrides
(command-line flags), in that order.

TOML layout (every key optional)::

    deployment = "ssh://ops@gpu-host/opt/cosmicac"   # or a local directory

    [env]
    path = ".env"                                     # relative to the deployment
    var = "K8S_COMMON_CONFIG__interconnect__relays"

    [commands]
    apply = "task apply-wrk-server-k8s-nvidia-common-config"
    restart = 'task restart SERVICES="cosmicac-wrk-server-k8s-nvidia"'
    list = "cosmicac jobs list"
    delete = "cosmicac jobs delete {id}"
    create = ""           # unknown by default; {name} {tags} {location} {gpu_model} {gpu_count}
                          # {image} {disk_gb}, {id} or any column (see README's config section)
    test_job = ""         # the small job step 5 creates with j; empty: the operator creates one
    env = { PATH = "/opt/bin:/usr/bin" }              # extra environment for commands

    [relay]
    storage = "/var/lib/blind-relay"
    port = 49737
    host = "0.0.0.0"
    address = ""          # how the deployment host reaches the relay (default: guessed)
    metrics = "127.0.0.1:49738"                       # or "off"
    bootstrap = []        # HOST:PORT strings; empty = the public HyperDHT nodes

    [monitor]
    prometheus = ""       # e.g. "http://127.0.0.1:9090": `cosmictui monitor` shows every relay it scrapes

    [ssh]
    known_hosts = "~/.ssh/known_hosts"
    identity = []         # private key files; empty = agent + default keys
    connect_timeout = 10

    [jobs]
    poll_interval = 5
    stuck_after = 300     # seconds in Creating/Starting before a job counts as stuck
    stale_after = 300     # seconds without a status update before a job counts as stale
    stuck_statuses = ["creating", "starting", "pending"]
    done_statuses = ["running", "ready", "active", "completed", "succeeded", "stopped"]
    failed_statuses = ["failed", "error", ...]   # any other status is unknown: never "left Creating"

README's "Configuration" section has a real deployment's file; a test loads it with this loader.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from cosmictui.ops.vocabulary import DONE_STATUSES, FAILED_STATUSES, STUCK_STATUSES, StatusSets

ENV_VAR = "K8S_COMMON_CONFIG__interconnect__relays"
APPLY_COMMAND = "task apply-wrk-server-k8s-nvidia-common-config"
RESTART_COMMAND = 'task restart SERVICES="cosmicac-wrk-server-k8s-nvidia"'
LIST_COMMAND = "cosmicac jobs list"
DELETE_COMMAND = "cosmicac jobs delete {id}"
#: Unknown by default: the operator page documents only `list` and `delete`, and `create` needs
#: fields a list does not show (tags, location, GPU model and count, image, disk). Recovery offers
#: delete & recreate only with a configured template or one the operator reviewed.
CREATE_COMMAND = ""
#: The fields a create template may name, as CosmicAC's docs list them for `jobs create`.
CREATE_FIELDS = ("name", "tags", "location", "gpu_model", "gpu_count", "image", "disk_gb")
RELAY_STORAGE = "/var/lib/blind-relay"
RELAY_PORT = 49737
RELAY_METRICS = "127.0.0.1:49738"


class ConfigError(ValueError):
    """The config file is unreadable or names something we do not know."""


def default_config_path() -> Path:
    """`$XDG_CONFIG_HOME/cosmictui/config.toml` (XDG default `~/.config`)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "cosmictui" / "config.toml"


@dataclass(frozen=True)
class Settings:
    """Everything the wizard, the checks and the headless commands need to know."""

    deployment: str = "."
    env_path: str = ".env"
    env_var: str = ENV_VAR
    apply_command: str = APPLY_COMMAND
    restart_command: str = RESTART_COMMAND
    list_command: str = LIST_COMMAND
    delete_command: str = DELETE_COMMAND
    create_command: str = CREATE_COMMAND
    command_env: dict[str, str] = field(default_factory=dict)
    relay_storage: str = RELAY_STORAGE
    relay_port: int = RELAY_PORT
    relay_host: str = "0.0.0.0"
    relay_address: str = ""
    relay_metrics: str = RELAY_METRICS
    relay_bootstrap: tuple[str, ...] = ()
    #: start the relay with --kernel-forwarding (established pairs forwarded by nftables): True, False,
    #: or None ("auto", the default): on when this host can have it (relayproc.choose_kernel_forwarding)
    relay_kernel_forwarding: bool | None = None
    ssh_known_hosts: str = "~/.ssh/known_hosts"
    ssh_identity: tuple[str, ...] = ()
    ssh_connect_timeout: float = 10.0
    poll_interval: float = 5.0
    stuck_after: float = 300.0
    stale_after: float = 300.0
    stuck_statuses: tuple[str, ...] = tuple(sorted(STUCK_STATUSES))
    done_statuses: tuple[str, ...] = tuple(sorted(DONE_STATUSES))
    failed_statuses: tuple[str, ...] = tuple(sorted(FAILED_STATUSES))
    test_job_command: str = ""
    #: a Prometheus server whose relays `cosmictui monitor` shows when no relay is named ("" = none)
    monitor_prometheus: str = ""
    config_path: str | None = None

    @property
    def statuses(self) -> StatusSets:
        """The configured status sets: which statuses are stuck, done (left Creating), failed."""
        return StatusSets.of(self.stuck_statuses, self.done_statuses, self.failed_statuses)

    @property
    def metrics_url(self) -> str | None:
        """`http://HOST:PORT` of the relay's metrics endpoint, None when metrics are off."""
        if not self.relay_metrics or self.relay_metrics == "off":
            return None
        if "://" in self.relay_metrics:
            return self.relay_metrics.rstrip("/")
        return f"http://{self.relay_metrics}"

    def with_overrides(self, **overrides: Any) -> Settings:
        """A copy with some fields replaced; None values are ignored (unset flags)."""
        clean = {k: v for k, v in overrides.items() if v is not None}
        _check_names(clean, "override")
        return replace(self, **{k: _coerce(k, v) for k, v in clean.items()})


# TOML (section, key) -> Settings field
_TOML_KEYS: dict[tuple[str | None, str], str] = {
    (None, "deployment"): "deployment",
    ("env", "path"): "env_path",
    ("env", "var"): "env_var",
    ("commands", "apply"): "apply_command",
    ("commands", "restart"): "restart_command",
    ("commands", "list"): "list_command",
    ("commands", "delete"): "delete_command",
    ("commands", "create"): "create_command",
    ("commands", "env"): "command_env",
    ("relay", "storage"): "relay_storage",
    ("relay", "port"): "relay_port",
    ("relay", "host"): "relay_host",
    ("relay", "address"): "relay_address",
    ("relay", "metrics"): "relay_metrics",
    ("relay", "bootstrap"): "relay_bootstrap",
    ("relay", "kernel_forwarding"): "relay_kernel_forwarding",
    ("ssh", "known_hosts"): "ssh_known_hosts",
    ("ssh", "identity"): "ssh_identity",
    ("ssh", "connect_timeout"): "ssh_connect_timeout",
    ("jobs", "poll_interval"): "poll_interval",
    ("jobs", "stuck_after"): "stuck_after",
    ("jobs", "stale_after"): "stale_after",
    ("jobs", "stuck_statuses"): "stuck_statuses",
    ("jobs", "done_statuses"): "done_statuses",
    ("jobs", "failed_statuses"): "failed_statuses",
    ("commands", "test_job"): "test_job_command",
    ("monitor", "prometheus"): "monitor_prometheus",
}
_FIELD_TYPES = {f.name: f.type for f in fields(Settings)}


def _check_names(values: dict[str, Any], what: str) -> None:
    unknown = sorted(set(values) - set(_FIELD_TYPES))
    if unknown:
        raise ConfigError(f"unknown {what} {', '.join(unknown)}; known: {', '.join(sorted(_FIELD_TYPES))}")


#: Settings field -> the key an operator writes in the config file ("[relay] port").
_CONFIG_KEY = {name: (f"[{section}] {key}" if section else key) for (section, key), name in _TOML_KEYS.items()}
#: A field's type in the words of a config file.
_KIND_WORDS = {
    "bool | None": 'true, false or "auto"',
    "bool": "true or false",
    "int": "a whole number",
    "float": "a number",
    "tuple": "a list of strings",
    "dict": "a table of strings",
    "str": "a string",
}


def _coerce(name: str, value: Any) -> Any:
    """Bring TOML/flag values into the field's type, with an error naming its config key."""
    kind = str(_FIELD_TYPES[name])
    key = _CONFIG_KEY.get(name, name)
    words = _KIND_WORDS.get(kind) or next((w for k, w in _KIND_WORDS.items() if kind.startswith(k)), kind)
    try:
        if kind == "bool | None":  # true, false, or "auto" (None): decided where it is used
            if value == "auto":
                return None
            if not isinstance(value, bool):
                raise TypeError
            return value
        if kind == "bool":
            if not isinstance(value, bool):
                raise TypeError
            return value
        if kind == "int":
            if isinstance(value, bool):
                raise TypeError
            return int(value)
        if kind == "float":
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        if kind.startswith("tuple"):
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise TypeError
            return tuple(value)
        if kind.startswith("dict"):
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise TypeError
            return dict(value)
        if kind.startswith("str"):
            if not isinstance(value, str):
                raise TypeError
            return value
    except (TypeError, ValueError):
        raise ConfigError(f"{key} must be {words}, got {value!r}") from None
    return value


def _coerce_in(source: str, name: str, value: Any) -> Any:
    """`_coerce`, its error saying which file."""
    try:
        return _coerce(name, value)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def settings_from_toml(data: dict[str, Any], source: str = "config") -> dict[str, Any]:
    """Flatten a parsed TOML document into Settings field values."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and (None, key) not in _TOML_KEYS:
            for sub, subvalue in value.items():
                name = _TOML_KEYS.get((key, sub))
                if name is None:
                    raise ConfigError(f"{source}: unknown key [{key}] {sub}")
                out[name] = _coerce_in(source, name, subvalue)
        else:
            name = _TOML_KEYS.get((None, key))
            if name is None:
                raise ConfigError(f"{source}: unknown key {key}")
            out[name] = _coerce_in(source, name, value)
    return out


def load_settings(config: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Settings from `config` (or the default file when it exists) plus overrides.

    A `config` given explicitly must exist; the default one is optional.
    """
    path = Path(config).expanduser() if config is not None else default_config_path()
    values: dict[str, Any] = {}
    if config is not None or path.is_file():
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
        values = settings_from_toml(data, str(path))
        values["config_path"] = str(path)
    return Settings(**values).with_overrides(**overrides)
