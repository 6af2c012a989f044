"""The store's own configuration (the broker builds it from its BrokerConfig)."""

from __future__ import annotations

from dataclasses import dataclass

from .consume_queue import CQ_ENTRY_SIZE

#: What retention may do when the disk is short of space (see :class:`StoreConfig`).
DISK_FULL_POLICIES = ("refuse_writes", "delete_oldest")


@dataclass(frozen=True)
class StoreConfig:
    """Where and how the store keeps its files.

    Attributes:
        store_path_root_dir: root folder (``commitlog/``, ``consumequeue/``, ``config/``,
            ``checkpoint`` and the ``lock`` file live under it).
        mapped_file_size_commit_log: size of one commit-log segment file in bytes.
        mapped_file_size_consume_queue: size of one consume-queue segment file in bytes; a
            multiple of the 20-byte entry.
        file_reserved_time: hours a commit-log segment is kept after its last write.
        disk_max_used_space_ratio: percent of the disk past which it is short of space: the
            oldest segments are deleted regardless of age if ``disk_full_policy`` allows it.
        disk_full_policy: what retention does past ``disk_max_used_space_ratio``:
            ``refuse_writes`` (default) deletes nothing before its time -- writes are refused
            once the disk reaches ``disk_refuse_writes_ratio`` -- and ``delete_oldest``
            (RocketMQ's forced clean-up) deletes the oldest segments, read or not, until the
            disk is below the ratio again.
        disk_refuse_writes_ratio: percent of the disk past which writes are refused, with a
            clear error, until space is freed (reads go on).
        max_message_size: largest encoded stored message accepted, in bytes.
        max_open_consume_queue_files: consume-queue files kept open at most (the least
            recently used is closed to open another); 0 derives it from the open-files limit
            (half the soft ``RLIMIT_NOFILE``, raised to the hard limit first).
    """

    store_path_root_dir: str
    mapped_file_size_commit_log: int = 1 << 30
    mapped_file_size_consume_queue: int = 300_000 * CQ_ENTRY_SIZE
    file_reserved_time: float = 72.0
    disk_max_used_space_ratio: int = 75
    disk_full_policy: str = "refuse_writes"
    disk_refuse_writes_ratio: int = 90
    max_message_size: int = 4 * 1024 * 1024
    max_open_consume_queue_files: int = 0

    def __post_init__(self) -> None:
        if not self.store_path_root_dir:
            raise ValueError("store_path_root_dir must not be empty")
        if self.mapped_file_size_commit_log < 4096:
            raise ValueError(
                f"mapped_file_size_commit_log must be at least 4096 bytes, "
                f"got {self.mapped_file_size_commit_log}"
            )
        cq = self.mapped_file_size_consume_queue
        if cq < CQ_ENTRY_SIZE or cq % CQ_ENTRY_SIZE:
            raise ValueError(
                f"mapped_file_size_consume_queue must be a positive multiple of "
                f"{CQ_ENTRY_SIZE}, got {cq}"
            )
        if self.max_open_consume_queue_files and self.max_open_consume_queue_files < 16:
            raise ValueError(
                f"max_open_consume_queue_files must be 0 (derived) or at least 16, "
                f"got {self.max_open_consume_queue_files}"
            )
        if self.max_message_size <= 0:
            raise ValueError(f"max_message_size must be positive, got {self.max_message_size}")
        if self.file_reserved_time < 0:
            raise ValueError(
                f"file_reserved_time must not be negative, got {self.file_reserved_time}"
            )
        if not 0 <= self.disk_max_used_space_ratio <= 100:
            raise ValueError(
                f"disk_max_used_space_ratio must be 0..100, got {self.disk_max_used_space_ratio}"
            )
        if not 0 < self.disk_refuse_writes_ratio <= 100:
            raise ValueError(
                f"disk_refuse_writes_ratio must be 1..100, got {self.disk_refuse_writes_ratio}"
            )
        if self.disk_full_policy not in DISK_FULL_POLICIES:
            raise ValueError(
                f"disk_full_policy must be one of {', '.join(DISK_FULL_POLICIES)}, "
                f"got {self.disk_full_policy!r}"
            )
