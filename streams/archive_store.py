"""The Parquet archive on disk (or any fsspec / pyarrow filesystem): layout, atomic writes, resume points.

Layout: `<root>/<namespace>/<topic suffix>/<kind>/<YYYY-MM-DD>/<name>.parquet`, one row per Kafka
message with the record's fields plus `kafka_topic`, `kafka_partition`, `kafka_offset`,
`kafka_timestamp`, `kafka_key` and `namespace`.

A flush covers an offset range `[first, last]` of one partition and may make several files (one per
record kind and day). Each file is named `p<partition>-<first>-<last>-<i>of<n>-<kind>` and is written
under a temporary name, then moved into place. On start, a range whose n files are all there is
done; a range with some missing (a crash mid-flush) is deleted and consumed again. So the resume point
of a partition is one past the last complete range: nothing written twice, nothing missed.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from undertow.kernel.disk import stop_when_full
from undertow.schemas import Record, arrow_schema, record_type, to_arrow

META_FIELDS = [
    pa.field("kafka_topic", pa.string()), pa.field("kafka_partition", pa.int32()),
    pa.field("kafka_offset", pa.int64()), pa.field("kafka_timestamp", pa.timestamp("ms", tz="UTC")),
    pa.field("kafka_key", pa.string()), pa.field("namespace", pa.string()),
]
_NAME = re.compile(r"^p(\d+)-(\d+)-(\d+)-(\d+)of(\d+)-([a-z_]+)\.parquet$")


@dataclass(frozen=True)
class ArchivedMessage:
    """One decoded message to archive, with where it came from."""

    record: Record
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None


@dataclass(frozen=True)
class ArchiveFile:
    """A file of the archive, parsed from its path."""

    path: str
    suffix: str  # topic suffix: experiences.ready, metrics, ...
    kind: str
    partition: int
    first: int
    last: int
    index: int
    count: int


@dataclass
class ResumeScan:
    """What a start finds: the next offset per partition, and leftovers of an interrupted flush."""

    next_offsets: dict[int, int] = field(default_factory=dict)
    incomplete: list[ArchiveFile] = field(default_factory=list)


def table_schema(kind: str) -> pa.Schema:
    """The archive schema of one record kind: its fields, then the Kafka columns."""
    cls = record_type(kind)
    if cls is None:
        raise ValueError(f"archive: unknown record kind {kind!r}")
    base = arrow_schema(cls)
    return pa.schema(list(base) + META_FIELDS, metadata=base.metadata)


def open_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """A filesystem and base path for a local path or any URI pyarrow or fsspec understands."""
    if "://" not in uri:
        path = pafs.LocalFileSystem().normalize_path(str(Path(uri).expanduser().resolve()))
        return pafs.LocalFileSystem(), path
    try:
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        import fsspec  # a scheme pyarrow does not speak natively (memory://, gcs via gcsfs, ...)

        fs, path = fsspec.core.url_to_fs(uri)
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


class ArchiveStore:
    """Reads and writes the archive of one namespace under `root` (a path or URI)."""

    def __init__(self, root: str, namespace: str):
        self.fs, self.base = open_filesystem(root)
        self.namespace = namespace

    def topic_dir(self, suffix: str) -> str:
        return f"{self.base}/{self.namespace}/{suffix}"

    def files(self, suffix: str) -> list[ArchiveFile]:
        """Every archive file of one topic (temporary files left out)."""
        selector = pafs.FileSelector(self.topic_dir(suffix), allow_not_found=True, recursive=True)
        out = []
        for info in self.fs.get_file_info(selector):
            match = _NAME.match(info.base_name) if info.type == pafs.FileType.File else None
            if match:
                p, first, last, i, n, kind = match.groups()
                out.append(ArchiveFile(info.path, suffix, kind, int(p), int(first), int(last), int(i), int(n)))
        return sorted(out, key=lambda f: (f.partition, f.first, f.index))

    def scan(self, suffix: str) -> ResumeScan:
        """Where each partition resumes: one past its last complete range."""
        ranges: dict[tuple[int, int, int, int], list[ArchiveFile]] = defaultdict(list)
        for f in self.files(suffix):
            ranges[(f.partition, f.first, f.last, f.count)].append(f)
        scan = ResumeScan()
        for (partition, _first, last, count), files in ranges.items():
            if len({f.index for f in files}) == count:
                scan.next_offsets[partition] = max(scan.next_offsets.get(partition, 0), last + 1)
            else:
                scan.incomplete.extend(files)
        return scan

    def recover(self, suffix: str) -> dict[int, int]:
        """Delete what an interrupted flush left; returns the next offset per partition."""
        scan = self.scan(suffix)
        selector = pafs.FileSelector(self.topic_dir(suffix), allow_not_found=True, recursive=True)
        leftovers = [i.path for i in self.fs.get_file_info(selector)
                     if i.type == pafs.FileType.File and i.base_name.startswith("_") and i.base_name.endswith(".tmp")]
        for path in [f.path for f in scan.incomplete] + leftovers:
            self.fs.delete_file(path)
        return scan.next_offsets

    def write_range(self, suffix: str, topic: str, partition: int, first: int, last: int,
                    messages: list[ArchivedMessage]) -> list[str]:
        """Write one partition's consumed range `[first, last]`; returns the paths written."""
        tables = self._tables(topic, partition, messages)
        paths: list[str] = []
        # A full disk: the range's files written so far go too (a reader would take them for rows),
        # and the archiver stops; its consumer never committed the range, a restart writes it again.
        with stop_when_full(f"archive {suffix} partition {partition} offsets {first}-{last}", self.base,
                            cleanup=lambda: self._delete(paths)):
            for i, ((kind, day), table) in enumerate(sorted(tables.items()), start=1):
                name = f"p{partition:03d}-{first:012d}-{last:012d}-{i}of{len(tables)}-{kind}.parquet"
                directory = f"{self.topic_dir(suffix)}/{kind}/{day}"
                paths.append(self._write_atomically(directory, name, table))
        return paths

    def _delete(self, paths: list[str]) -> None:
        for path in paths:
            if self.fs.get_file_info(path).type != pafs.FileType.NotFound:
                self.fs.delete_file(path)

    def _tables(self, topic: str, partition: int, messages: list[ArchivedMessage]) -> dict[tuple[str, str], pa.Table]:
        groups: dict[tuple[str, str], list[ArchivedMessage]] = defaultdict(list)
        for m in messages:
            day = dt.datetime.fromtimestamp(m.timestamp_ms / 1000, dt.timezone.utc).strftime("%Y-%m-%d")
            groups[(m.record.kind, day)].append(m)
        return {key: archive_table(group, topic, self.namespace) for key, group in groups.items()}

    def _write_atomically(self, directory: str, name: str, table: pa.Table) -> str:
        # Readers skip names starting with "_": a half-written file is never taken for a done range.
        self.fs.create_dir(directory, recursive=True)
        temporary, final = f"{directory}/_{uuid.uuid4().hex}.tmp", f"{directory}/{name}"
        pq.write_table(table, temporary, filesystem=self.fs, compression="zstd")  # a failed write deletes it
        self.fs.move(temporary, final)
        return final


def archive_table(messages: list[ArchivedMessage], topic: str, namespace: str) -> pa.Table:
    """Rows of one record kind: the record fields (schemas.to_arrow), then the Kafka columns."""
    table = to_arrow([m.record for m in messages])
    n = len(messages)
    meta = {
        "kafka_topic": [topic] * n, "kafka_partition": [m.partition for m in messages],
        "kafka_offset": [m.offset for m in messages], "kafka_timestamp": [m.timestamp_ms for m in messages],
        "kafka_key": [m.key.decode("utf-8", "replace") if m.key is not None else None for m in messages],
        "namespace": [namespace] * n,
    }
    for f in META_FIELDS:
        table = table.append_column(f, pa.array(meta[f.name], type=f.type))
    return table
