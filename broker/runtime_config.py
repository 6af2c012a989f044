"""Settings an operator may change while the broker runs (RocketMQ's ``updateBrokerConfig``).

Only the keys of :data:`RUNTIME_KEYS` change at run time: each is read where it is used, or
handed to the one component that keeps a copy (the store's retention settings, the check
service's limits, the topic manager's auto-create switch), so a change takes effect at once
without a restart. Every other key (ports, paths, the store's file sizes, TLS, cluster
settings) is refused with the list of those that may change.

A change is kept across restarts: the changed keys are written to ``config/runtime.json``
under the store root (an atomic replace) and applied over the configuration file at start,
each with a WARNING naming the key, its value from the configuration and the value that
replaces it -- so an operator who later edits the configuration file sees why the file's
value is not the one in effect. The file carries ``txmqCrc32``, the CRC-32 of the rest in
canonical JSON (:func:`.store.fileio.checked_json`). Remove a key from that file while the
broker is stopped to let the configuration file decide again, and remove the ``txmqCrc32`` line
with it (a file without one is read unchecked, as one written before checksums; the broker
writes it again with one). A damaged file (a checksum that does not match) is set aside, never
a failed start.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import structlog

from .config import KEY_FIELDS, BrokerConfig, ConfigError, convert_value
from .store.fileio import atomic_write, checked_json, dumps_with_checksum, set_aside

log = structlog.get_logger(__name__)

#: The keys that may change while the broker runs, with what a change does.
RUNTIME_KEYS: dict[str, str] = {
    "autoCreateTopicEnable": "sends to unknown topics create them (or are refused) from now on",
    "maxReconsumeTimes": "redeliveries before a message goes to the dead-letter queue",
    "rejectTransactionMessage": "refuse new half messages (decisions and checks go on)",
    "transactionTimeOut": "age of a half before its first check; pending ones are rescheduled",
    "transactionCheckInterval": "time between checks of a transaction; pending ones rescheduled",
    "transactionCheckMax": "delivered checks before a transaction is parked",
    "fileReservedTime": "hours a commit-log segment is kept; applies from the next clean-up",
    "diskMaxUsedSpaceRatio": "disk use (%) past which retention acts on the disk's fill",
    "diskFullPolicy": "refuse_writes or delete_oldest past diskMaxUsedSpaceRatio",
    "diskRefuseWritesRatio": "disk use (%) past which writes are refused",
}


#: The file under the store root that keeps run-time changes across restarts.
RUNTIME_FILE = os.path.join("config", "runtime.json")


class NotRuntimeChangeable(ConfigError):
    """A key that exists but cannot change while the broker runs."""


def parse_properties(text: str) -> dict[str, str]:
    """``key=value`` lines (``MixAll.string2Properties``): blank lines and ``#`` comments are
    skipped, whitespace around keys and values is dropped."""
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ConfigError(f"line {lineno}: {line!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def updated(config: BrokerConfig, changes: Mapping[str, Any], source: str) -> BrokerConfig:
    """``config`` with ``changes`` (RocketMQ key names) applied and validated as a whole.

    Raises:
        NotRuntimeChangeable: a key that cannot change while the broker runs (names them all).
        ConfigError: an unknown key, or a value that is not valid (names the key).
    """
    if not changes:
        raise ConfigError("no setting to change")
    unknown = sorted(k for k in changes if k not in KEY_FIELDS)
    if unknown:
        raise ConfigError(f"unknown configuration key(s): {', '.join(unknown)}")
    fixed = sorted(k for k in changes if k not in RUNTIME_KEYS)
    if fixed:
        raise NotRuntimeChangeable(
            f"{', '.join(fixed)} cannot change while the broker runs (set it in the "
            f"configuration file and restart); these can: {', '.join(sorted(RUNTIME_KEYS))}"
        )
    values = {
        KEY_FIELDS[k].name: convert_value(KEY_FIELDS[k], v, source) for k, v in changes.items()
    }
    return config.replace(**values)


def runtime_file(config: BrokerConfig) -> str:
    return os.path.join(config.store_path_root_dir, RUNTIME_FILE)


def load_saved(config: BrokerConfig) -> BrokerConfig:
    """``config`` with the run-time changes kept in the store applied (a WARNING per key).

    A damaged file, or one naming a key or value this version refuses, never stops the start:
    it is set aside (renamed ``runtime.json.damaged-<time>``) with an ERROR naming it, and the
    configuration is used as it is.
    """
    path = runtime_file(config)
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return config
    try:
        saved, _ = checked_json(raw, path)
        if not isinstance(saved, dict):
            raise ValueError("not a JSON object")
        new = updated(config, saved, path) if saved else config
    except ValueError as exc:  # ConfigError too
        aside = set_aside(path)
        log.error(
            "runtime_settings_set_aside",
            file=path,
            moved_to=aside,
            error=str(exc),
            hint="the configured values are used; set the changes again with txmq config set",
        )
        return config
    for key in sorted(saved):
        attr = KEY_FIELDS[key].name
        before, after = getattr(config, attr), getattr(new, attr)
        if before != after:
            log.warning(
                "runtime_setting_applied",
                key=key,
                configured=before,
                value=after,
                file=path,
                hint="changed at run time (txmq config set); remove it and the txmqCrc32 line "
                "from the file while the broker is stopped to use the configured value",
            )
    return new


def save(config: BrokerConfig, changes: Mapping[str, Any]) -> None:
    """Add ``changes`` (already validated) to the store's run-time settings file."""
    path = runtime_file(config)
    try:
        with open(path, "rb") as fh:
            saved, _ = checked_json(fh.read(), path)
        if not isinstance(saved, dict):
            saved = {}
    except (FileNotFoundError, ValueError):
        saved = {}
    for key in changes:
        saved[key] = getattr(config, KEY_FIELDS[key].name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(path, dumps_with_checksum(saved, indent=2, sort_keys=True) + b"\n")
