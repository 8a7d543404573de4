"""``parquet:/path`` — a Parquet change log written by Spark's own file sinks.

Layout under the path:

- ``snapshot/`` — the table's rows at the initial snapshot (one Spark batch write,
  replaced whole if the snapshot is re-run, so a crash mid-write leaves no half copy
  once the run completes); every row carries ``_litecdc_cid``, the cid it was read at.
- ``changes/`` — every change event after the initial snapshot version
  (``_litecdc_cid``, ``_litecdc_seq``, ``_litecdc_op``, then the row), appended by a
  Spark structured-streaming query over ``format("litecdc")``. Its checkpoint
  (``_checkpoint/``) and the file sink's own log (``changes/_spark_metadata``) make
  each micro-batch land exactly once, across crashes and restarts; read the directory
  with Spark (``spark.read.parquet(path + "/changes")``) so only committed files count.

Snapshot rows and change events overlap (a row read at cid 12 may also appear as an
event with cid ≤ 12): a consumer keeps, per key, the row or event with the highest
``_litecdc_cid`` (events in ``(_litecdc_cid, _litecdc_seq)`` order).

A column added at the source: events from then on carry it, in files of their own
(read ``changes/`` with ``.option("mergeSchema", "true")`` to see every column). The
query's columns are fixed when it starts, so its source (``ChangeLogSource``, the
litecdc change stream) plans no batch once the table has a column the query lacks, and
fails a batch planned just before that meets a value in one, before anything of it is
written; the server starts the query again with the column, and the batch is read
again. A column with a DEFAULT starts the log over.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import ReadLimit

from litecdc.errors import SinkError
from litecdc.pipeline.datasource import (
    LitecdcDataSource,
    StreamReader,
)
from litecdc.pipeline.sinks.base import check_case_blind_names
from litecdc.wire import unicode_fold

if TYPE_CHECKING:
    from pyspark.sql import DataFrameReader, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.types import StructType

    from litecdc.pipeline.tables import TableSpec

log = logging.getLogger("litecdc.pipeline")

SCHEME = "parquet:"


@dataclass(frozen=True)
class ParquetLog:
    path: Path

    @property
    def snapshot_dir(self) -> Path:
        return self.path / "snapshot"

    @property
    def changes_dir(self) -> Path:
        return self.path / "changes"

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "_checkpoint"


def check_names(log: ParquetLog, spec: TableSpec) -> None:
    """SchemaMismatchError when two of the log's columns are one name to Spark, which
    takes names regardless of letter case (idents QA: `run` failed on every retry with
    Spark's COLUMN_ALREADY_EXISTS, naming neither the table nor what to do)."""
    check_case_blind_names(
        "parquet", "Spark", str(log.path), spec.change_schema().names, unicode_fold
    )


def is_parquet_url(url: str) -> bool:
    return url.lower().startswith(SCHEME)


def parse_parquet_url(url: str) -> ParquetLog:
    """``parquet:/abs/path`` or ``parquet:///abs/path`` → the log's directory."""
    rest = url[len(SCHEME) :]
    path = rest[2:] if rest.startswith("//") else rest
    if not path or not path.startswith("/"):
        raise SinkError(
            f"parquet sink URL {url!r} needs an absolute directory: parquet:/data/lake/orders"
        )
    return ParquetLog(Path(path))


def write_snapshot(reader: DataFrameReader, target: ParquetLog) -> int:
    """Read the whole table through ``reader`` (format litecdc, snapshot mode) and write
    it as ``snapshot/``, replacing an earlier attempt; returns the row count."""
    frame = reader.load()
    frame.write.mode("overwrite").parquet(str(target.snapshot_dir))
    rows: int = frame.sparkSession.read.parquet(str(target.snapshot_dir)).count()
    return rows


def start_changes(
    spark: SparkSession,
    options: dict[str, str],
    target: ParquetLog,
    *,
    available_now: bool,
    interval_seconds: float,
) -> StreamingQuery:
    """The structured-streaming query appending change events to ``changes/``."""
    spark.dataSource.register(ChangeLogSource)
    stream = spark.readStream.format(ChangeLogSource.name())
    for key, value in options.items():
        stream = stream.option(key, value)
    writer = (
        stream.option("mode", "changes")
        .load()
        .writeStream.format("parquet")
        .option("path", str(target.changes_dir))
        .option("checkpointLocation", str(target.checkpoint_dir))
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{max(interval_seconds, 0.1)} seconds")
    return writer.start()


def applied_cid(query: StreamingQuery) -> int | None:
    """The end offset (cid) of the query's last completed micro-batch."""
    progress: Any = query.lastProgress
    if not progress:
        return None
    for source in progress.get("sources", []):
        end = source.get("endOffset")
        if isinstance(end, str):
            end = json.loads(end)
        if isinstance(end, dict) and "cid" in end:
            return int(end["cid"])
    return None


def restart(target: ParquetLog) -> None:
    """A re-snapshot: the old log has a gap the source can no longer fill, so the
    changes and their checkpoint start over (the snapshot is rewritten)."""
    for directory in (target.changes_dir, target.checkpoint_dir):
        if directory.exists():
            log.warning("parquet log %s: starting over (%s removed)", target.path, directory)
            shutil.rmtree(directory)


class ChangeLogSource(LitecdcDataSource):
    """The litecdc change stream (``format("litecdc")``, ``mode=changes``) as the log
    reads it: never past a column the query does not have (see the module docstring),
    instead of leaving the column's values out."""

    @classmethod
    def name(cls) -> str:
        return "litecdc_changelog"

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        super().streamReader(schema)  # its checks
        return ChangeLogStreamReader(self.opts, tuple(schema.fieldNames()))


class ChangeLogStreamReader(StreamReader):
    """``StreamReader`` that plans no batch once the table has columns beyond its own
    (the server starts the query again with them); its batches refuse events with such
    columns, as every change read does (``datasource.read_changes``: a column added
    after the batch was planned)."""

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        end = super().latestOffset(start, limit)
        if end["cid"] > start["cid"]:
            columns = self.client.table_spec(self.opts.table).change_schema().names
            added = [n for n in columns if n not in self.names]
            if added:
                log.info(
                    "litecdc change log of %s: column(s) %s added at the source; waiting to "
                    "be started again with them",
                    self.opts.table, ", ".join(added),
                )  # fmt: skip
                return dict(start)
        return end
