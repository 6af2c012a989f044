"""Consumer group settings in a broker group: set on the leader, copied to the followers with
the other state files, served by the next leader after a failover.  Real processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import BrokerCluster, Replica
from txmq.client.admin import AsyncAdminClient

pytestmark = pytest.mark.slow


def stored_group(r: Replica, group: str) -> dict[str, Any] | None:
    """The group's entry in the replica's ``config/subscriptionGroup.json`` (None: none yet)."""
    path = Path(r.store) / "config" / "subscriptionGroup.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    entry = doc.get("subscriptionGroupTable", {}).get(group)
    return dict(entry) if entry is not None else None


async def test_group_settings_reach_the_followers_and_survive_a_failover(
    make_cluster: Any,
) -> None:
    bc: BrokerCluster = make_cluster()
    leader = await bc.start_group("g1")
    async with AsyncAdminClient(leader.addr) as admin:
        await admin.update_group_config("fifo-g", orderly=True, retry_max_times=3)
    followers = [r for r in bc.replicas.values() if r.replica != leader.replica]

    async def copied() -> bool:
        return all(
            (stored_group(r, "fifo-g") or {}).get("consumeMessageOrderly") is True
            for r in followers
        )

    await bc.wait(copied, 20, "the followers never got the group's settings")
    bc.kill("g1", leader.replica)
    new_leader = await bc.wait_leader("g1", not_replica=leader.replica)
    async with AsyncAdminClient(new_leader.addr) as admin:
        got = await admin.group_config("fifo-g")
    assert (got["consumeMessageOrderly"], got["retryMaxTimes"]) == (True, 3)
