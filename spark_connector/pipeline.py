"""txmq -> txmq pipelines: exactly once without trusting Spark's checkpoint.

With the option ``pipeline`` on both the source and the sink of a streaming query, every batch
decision of the sink also records the input range the batch consumed: the source's offsets at
the batch's start and end, as Spark's offset log holds them.  The broker keeps, per producer
group and pipeline, where the pipeline is (the end of its last decided batch) and refuses a
decision that does not start there, so two batches never consume the same input.  The source
asks the broker first:

* a query without offsets in its checkpoint (a new checkpoint, or one that lost them) starts
  where the pipeline is;
* planning a batch from a start where a decided batch started, it ends that batch exactly
  where the decided one ended.

The source's offsets carry the entry ``"@pipeline:<name>": {"0": 0}``, by which the sink finds
them in the offset log (and knows its source resumes from the pipeline).

The sink's batch key is ``<pipeline>-<run>-<batchId>`` (``run``: fresh at each query start), so
keys never collide across restarts whatever the checkpoint lost.  A batch whose input range was
decided already (Spark runs it again after a crash or a lost commit log) rolls back what its
tasks wrote: its rows were delivered by the first decision.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any
from urllib.parse import urlparse

from txmq.client.logs import get_logger
from txmq.protocol.errors import TxmqError

from .options import (
    OffsetMap,
    SinkOptions,
    SourceOptions,
    normalize_offsets,
    offsets_text,
    pipeline_producer_group,
)
from .session import BrokerSession, run
from .sink import PartitionResult, decide_batch

log = get_logger(__name__)


def run_token() -> str:
    """A fresh token per query start, part of a pipeline's batch keys."""
    return uuid.uuid4().hex[:12]


def pipeline_batch_key(pipeline: str, run_id: str, batch_id: int | str) -> str:
    return f"{pipeline}-{run_id}-{batch_id}"


# --- the checkpoint's offset log ----------------------------------------------------------


def _read_text(path: str) -> str | None:
    """A checkpoint file's text, or None when it does not exist.  Local paths and ``file:``
    URIs are read directly; other schemes through pyarrow's file systems (HDFS, S3, ...)."""
    parsed = urlparse(path)
    if parsed.scheme in ("", "file"):
        local = parsed.path if parsed.scheme == "file" else path
        try:
            with open(local, encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            return None
    from pyarrow import fs

    filesystem, inner = fs.FileSystem.from_uri(path)
    if filesystem.get_file_info(inner).type == fs.FileType.NotFound:
        return None
    with filesystem.open_input_stream(inner) as stream:
        text: str = stream.read().decode("utf-8")
        return text


def marker(pipeline: str) -> str:
    """The entry a pipeline's source adds to its offsets (``{"0": 0}`` under this name, which
    no topic can have): it names the pipeline in Spark's offset log, so the sink finds its
    source's offsets there and knows the source resumes from the pipeline."""
    return f"@pipeline:{pipeline}"


def with_marker(offsets: OffsetMap, pipeline: str) -> OffsetMap:
    return normalize_offsets({**offsets, marker(pipeline): {"0": 0}})


def _source_lines(checkpoint: str, batch_id: int) -> list[str] | None:
    """The per-source lines of a batch's offset-log entry ("-" for a source without offsets),
    or None when the log has no such batch."""
    text = _read_text(os.path.join(checkpoint, "offsets", str(batch_id)))
    if text is None:
        return None
    # "v1", the batch's metadata, then one line per source.
    return [line.strip() for line in text.strip("\n").split("\n")[2:]]


def logged_offsets(
    checkpoint: str, batch_id: int, pipeline: str
) -> tuple[OffsetMap, OffsetMap | None] | None:
    """The start and end offsets of ``batch_id``'s pipeline source from the checkpoint's
    offset log (Spark writes a batch's entry before the batch runs; its start is the previous
    entry, None for the first batch or when that entry is gone), or None when the log has no
    such batch.

    Raises:
        TxmqError: no source of the query carries the pipeline's marker (its txmq source lacks
            the option ``pipeline``).
    """
    lines = _source_lines(checkpoint, batch_id)
    if lines is None:
        return None
    name = marker(pipeline)
    found = [
        (i, doc)
        for i, line in enumerate(lines)
        if line.startswith("{")
        for doc in [json.loads(line)]
        if isinstance(doc, dict) and name in doc
    ]
    if len(found) != 1:
        raise TxmqError(
            f"the offset log of batch {batch_id} has {len(found)} txmq sources of pipeline "
            f"{pipeline!r}: give the query's txmq source the option pipeline={pipeline} too"
        )
    index, end = found[0]
    start = None
    before = _source_lines(checkpoint, batch_id - 1) if batch_id > 0 else None
    if before is not None and index < len(before) and before[index].startswith("{"):
        start = normalize_offsets(json.loads(before[index]))
    return normalize_offsets(end), start


# --- the sink's commit ----------------------------------------------------------------------


def _group(options: SinkOptions | SourceOptions) -> str:
    assert options.pipeline is not None
    return options.producer_group or pipeline_producer_group(options.pipeline)


def commit_pipeline_batch(
    options: SinkOptions, batch_key: str, batch_id: int, results: list[PartitionResult]
) -> dict[str, Any]:
    """Decide a pipeline's batch: commit its rows and record the input range it consumed, or,
    when that range was decided already, roll back what this run wrote.

    Raises:
        TxmqError: the checkpoint has no offsets of the batch, the broker refused the
            decision (the pipeline is elsewhere), or the range overlaps a decided one.
    """
    assert options.pipeline is not None and options.checkpoint_location is not None
    pipeline, group = options.pipeline, _group(options)
    logged = logged_offsets(options.checkpoint_location, batch_id, pipeline)
    if logged is None:
        raise TxmqError(f"the checkpoint's offset log has no batch {batch_id}")
    end_map, start_map = logged
    end = offsets_text(end_map)
    start = None if start_map is None else offsets_text(start_map)

    async def where(at: str | None) -> dict[str, Any]:
        async with BrokerSession(
            options.broker, options.request_timeout, options.credentials, options.tls
        ) as s:
            answer = await s.decide_batch(
                group, batch_key, query_only=True, pipeline=pipeline, start=at
            )
        found: dict[str, Any] = answer.get("pipeline") or {}
        return found

    probe = run(lambda: where(start if start is not None else end))
    head = probe.get("end")
    replay = False
    if start is None:
        # The first batch of this checkpoint: its source (it has the pipeline's marker)
        # started where the pipeline was, unless this is that batch again (its end was
        # recorded).
        if head is not None and (end == head or probe.get("next") is not None):
            replay = True
        start = head if head is not None else ""
    elif probe.get("next") is not None:
        if probe["next"] != end:
            raise TxmqError(
                f"batch {batch_id} of pipeline {pipeline!r} read up to {end}, but the batch "
                f"decided from {start} ended at {probe['next']}: does the source have the "
                "option pipeline?"
            )
        replay = True
    if replay:
        log.info("sink_pipeline_batch_replayed", pipeline=pipeline, batch_key=batch_key, end=end)
        return decide_batch(
            options.broker,
            group,
            batch_key,
            [],
            options.request_timeout,
            options.credentials,
            options.tls,
            pipeline=pipeline,
        )
    return decide_batch(
        options.broker,
        group,
        batch_key,
        results,
        options.request_timeout,
        options.credentials,
        options.tls,
        position=None if start == end else (pipeline, start, end),
        pipeline=pipeline,
    )


# --- the source's planning ------------------------------------------------------------------


def pipeline_position(options: SourceOptions, start: OffsetMap | None) -> dict[str, Any]:
    """Where the pipeline is (``end``) and, with ``start``, where the decided batch that
    started there ended (``next``); offsets as maps, None when unknown."""
    group, pipeline = _group(options), options.pipeline
    assert pipeline is not None

    async def go() -> dict[str, Any]:
        async with BrokerSession(
            options.broker, options.request_timeout, options.credentials, options.tls
        ) as s:
            answer = await s.decide_batch(
                group,
                f"{pipeline}-position",
                query_only=True,
                pipeline=pipeline,
                start=None if start is None else offsets_text(start),
            )
        found: dict[str, Any] = answer.get("pipeline") or {}
        return found

    found = run(go)
    return {
        k: None if found.get(k) is None else with_marker(json.loads(found[k]), pipeline)
        for k in ("end", "next")
    }
