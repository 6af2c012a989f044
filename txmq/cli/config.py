"""``txmq config get|set``: a running broker's settings."""

from __future__ import annotations

from typing import Any

import click

from .common import BROKER_OPTION, OUTPUT_OPTION, _admin, _emit


@click.group()
def config() -> None:
    """The broker's settings as it runs (RocketMQ's key names)."""


@config.command("get")
@BROKER_OPTION
@OUTPUT_OPTION
@click.argument("keys", nargs=-1)
def config_get(broker: str, output: str, keys: tuple[str, ...]) -> None:
    """Print the broker's settings (or only KEYS)."""
    settings = _admin(broker, lambda admin: admin.broker_config())
    unknown = [k for k in keys if k not in settings]
    if unknown:
        raise click.ClickException(f"no such setting: {', '.join(unknown)}")
    rows = [{"key": k, "value": v} for k, v in sorted(settings.items()) if not keys or k in keys]
    _emit(rows, output, [("key", "key", 36), ("value", "value", 0)])


@config.command("set")
@BROKER_OPTION
@OUTPUT_OPTION
@click.argument("settings", nargs=-1, required=True, metavar="KEY=VALUE...")
def config_set(broker: str, output: str, settings: tuple[str, ...]) -> None:
    """Change settings of the running broker (RocketMQ's updateBrokerConfig), kept across its
    restarts; prints the new values.

    \b
    Only these can change while the broker runs (any other key is refused):
      autoCreateTopicEnable     sends to unknown topics create them, or are refused
      maxReconsumeTimes         redeliveries before a message is dead-lettered
      rejectTransactionMessage  refuse new half messages
      transactionTimeOut        age (ms) of a half before its first check
      transactionCheckInterval  time (ms) between checks of a transaction
      transactionCheckMax       delivered checks before a transaction is parked
      fileReservedTime          hours a commit-log segment is kept
      diskMaxUsedSpaceRatio     disk use (%) past which retention acts on the fill
      diskFullPolicy            refuse_writes or delete_oldest
      diskRefuseWritesRatio     disk use (%) past which writes are refused

    In a cluster, set it on each replica of the group (each keeps its own settings).
    """
    changes: dict[str, str] = {}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="KEY=VALUE")
        changes[key.strip()] = value.strip()

    async def go(admin: Any) -> dict[str, str]:
        await admin.update_broker_config(changes)
        return dict(await admin.broker_config())

    now = _admin(broker, go)
    rows = [{"key": k, "value": now.get(k, "")} for k in sorted(changes)]
    _emit(rows, output, [("key", "key", 36), ("value", "value", 0)])
