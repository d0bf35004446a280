"""SQL over history: DuckDB views named after the topics, over the Parquet archive or live topics.

Views: `experiences` (experiences.ready), `pairs` (preference pairs on experiences.ready), `raw`
(experiences.raw), `rejected` (experiences.rejected, plus messages the archiver could not decode),
`metrics`, `task_stats`, `tasks`. Every row has the record's fields and `kafka_topic`,
`kafka_partition`, `kafka_offset`, `kafka_timestamp`, `kafka_key`, `namespace`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from undertow.streams.archive import archived
from undertow.streams.archive_store import ArchivedMessage, ArchiveStore, archive_table, open_filesystem, table_schema
from undertow.streams.consumer import read_messages
from undertow.streams.settings import KafkaSettings


@dataclass(frozen=True)
class View:
    """A SQL view: the record kind it holds, from one topic suffix (None: from every topic)."""

    kind: str
    suffix: str | None


VIEWS: dict[str, View] = {
    "experiences": View("experience", "experiences.ready"),
    "pairs": View("preference_pair", "experiences.ready"),
    "raw": View("experience", "experiences.raw"),
    "rejected": View("rejected", None),
    "metrics": View("metric", "metrics"),
    "task_stats": View("task_stat", "task-stats"),
    "tasks": View("task", "tasks"),
}


def archive_namespaces(root: str) -> list[str]:
    """The namespaces an archive holds."""
    fs, base = open_filesystem(root)
    infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory and not i.base_name.startswith("_"))


class History:
    """A DuckDB connection with one view per topic; `query(sql)` returns an Arrow table."""

    def __init__(self, tables: dict[str, pa.Table | ds.Dataset]):
        self.con = duckdb.connect()
        self._sources = tables  # DuckDB scans them lazily: they must outlive the connection's queries
        for name, table in tables.items():
            self.con.register(name, table)

    @classmethod
    def from_archive(cls, root: str, namespaces: list[str] | None = None) -> "History":
        """Views over the archive under `root` (every namespace it holds, or those given)."""
        stores = [ArchiveStore(root, ns) for ns in (namespaces or archive_namespaces(root))]
        fs = open_filesystem(root)[0]
        tables = {}
        for name, view in VIEWS.items():
            paths = [f.path for store in stores for suffix in _suffixes(store, view)
                     for f in store.files(suffix) if f.kind == view.kind]
            tables[name] = ds.dataset(paths, schema=table_schema(view.kind), filesystem=fs, format="parquet")
        return cls(tables)

    @classmethod
    def from_topics(cls, kafka: KafkaSettings, namespace: str, last: int | None = None) -> "History":
        """Views over the live topics of `namespace`: the `last` messages of each partition (None: all)."""
        tables = {}
        for name, view in VIEWS.items():
            suffixes = [view.suffix] if view.suffix else ["experiences.rejected"]
            rows = [t for s in suffixes for t in read_topic(kafka, f"{namespace}.{s}", namespace, last) if t.kind == view.kind]
            tables[name] = (pa.concat_tables([r.table for r in rows]) if rows
                            else table_schema(view.kind).empty_table())
        return cls(tables)

    def query(self, sql: str) -> pa.Table:
        try:
            return self.con.sql(sql).to_arrow_table()
        except duckdb.Error as e:
            raise ValueError(f"query: {e}") from None

    def close(self) -> None:
        self.con.close()


def _suffixes(store: ArchiveStore, view: View) -> list[str]:
    if view.suffix:
        return [view.suffix]
    infos = store.fs.get_file_info(pafs.FileSelector(f"{store.base}/{store.namespace}", allow_not_found=True))
    return [i.base_name for i in infos if i.type == pafs.FileType.Directory]


@dataclass(frozen=True)
class KindTable:
    """The rows of one record kind read from a topic."""

    kind: str
    table: pa.Table


def read_topic(kafka: KafkaSettings, topic: str, namespace: str, last: int | None = None) -> list[KindTable]:
    """Messages of a live topic as archive rows, per kind: all, or the `last` of each partition."""
    by_kind: dict[str, list[ArchivedMessage]] = defaultdict(list)
    for m in read_messages(kafka, topic, last):
        a = archived(m.value, topic, m.partition, m.offset, m.timestamp_ms, m.key)
        by_kind[a.record.kind].append(a)
    return [KindTable(kind, archive_table(msgs, topic, namespace)) for kind, msgs in sorted(by_kind.items())]
