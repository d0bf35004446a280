"""A full disk under the archive and the weight versions (the checkpoints': tests/trainer/
test_checkpoint_damage.py): the write fails with ENOSPC part way, nothing half written is left that
a reader would take, the writer stops with a message naming what and where, and once space is back
the same write completes. The device is full_disk.LimitedFileSystem: real files, a byte quota."""

from __future__ import annotations

from pathlib import Path

import pytest

from undertow.kernel.disk import DiskFull
import torch

from undertow.schemas import Experience, PreferencePair, WeightIntegrityError, announce_buckets
from undertow.streams.archive_store import ArchivedMessage, ArchiveStore
from undertow.streams.weights import FilesSender, Sending, WeightsConfig, fetch_files, manifest_of

from tests.helpers import wait_for

from .full_disk import LimitedFileSystem, files_under, limited

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SPACE = 1 << 30


def experience(i: int) -> Experience:
    return Experience(experience_id=f"e{i}", task_id="t", group_id="g", group_size=4, sample_index=i,
                      prompt_tokens=[1, 2], response_tokens=[3, 4], behaviour_logprobs=[-1.0, -1.0], reward=1.0,
                      policy_version=0, finish_reason="stop")


def messages(records, first_offset=0):
    return [ArchivedMessage(r, 0, first_offset + i, T0_MS + i, b"k") for i, r in enumerate(records)]


def test_a_full_disk_mid_flush_leaves_no_archive_file_and_the_range_is_written_again(tmp_path: Path):
    run = [experience(i) for i in range(4)]
    pair = PreferencePair(pair_id="p", task_id="t", prompt_tokens=[1], chosen_tokens=[2], rejected_tokens=[3])
    mixed = messages([run[0], pair], first_offset=4)  # one range, two files (two record kinds)
    sizes = [Path(p).stat().st_size for p in
             ArchiveStore(str(tmp_path / "probe"), "ns").write_range("experiences.ready", "t", 0, 4, 5, mixed)]

    store = ArchiveStore(limited(tmp_path / "archive", SPACE), "ns")
    store.write_range("experiences.ready", "ns.experiences.ready", 0, 0, 3, messages(run[:4]))
    before = files_under(tmp_path / "archive")
    LimitedFileSystem.free = sizes[0] + sizes[1] // 2  # the first file fits, the second stops half way
    with pytest.raises(DiskFull, match=r"archive experiences.ready partition 0 offsets 4-5: no space left on the "
                                       r"device under .*archive.*stopped cleanly") as caught:
        store.write_range("experiences.ready", "ns.experiences.ready", 0, 4, 5, mixed)
    assert LimitedFileSystem.refused == 1 and "No space left on device" in str(caught.value)
    # neither the first (complete) file of the torn range nor the second's temporary half remain
    assert files_under(tmp_path / "archive") == before
    assert store.scan("experiences.ready").next_offsets == {0: 4}

    LimitedFileSystem.free = SPACE  # space is back: a restart writes the range again
    store.write_range("experiences.ready", "ns.experiences.ready", 0, 4, 5, mixed)
    assert store.scan("experiences.ready").next_offsets == {0: 6}
    assert len(files_under(tmp_path / "archive")) == 3


def test_a_full_disk_while_writing_a_weights_version_leaves_no_version_a_worker_would_take(tmp_path: Path):
    uri = limited(tmp_path / "weights", SPACE)
    sender = FilesSender(Sending("policy", WeightsConfig(transport="files", uri=uri, bucket_bytes=20_000),
                                 producer=None, topics=None))
    buckets = sender.pack({f"w{i}": torch.full((4000,), float(i)) for i in range(4)}, None)  # 16 kB each
    assert len(buckets) > 2
    sender.write(1, buckets)
    before = files_under(tmp_path / "weights")

    LimitedFileSystem.free = sum(len(b) for b in buckets[:2]) + 100  # two buckets, then the device is full
    with pytest.raises(DiskFull, match=r"weights policy v2: no space left on the device under limited://"):
        sender.write(2, buckets)
    assert files_under(tmp_path / "weights") == before  # no v00000002, no partial directory
    # an announcement of v2 (had one gone out) finds nothing to take
    (tmp_path / "staging").mkdir()
    update = announce_buckets("policy", 2, manifest_of(buckets), transport="files", uri=sender.version_uri(2))
    with pytest.raises(WeightIntegrityError, match="does not exist"):
        fetch_files(update, str(tmp_path / "staging"))

    LimitedFileSystem.free = SPACE
    manifest = sender.write(2, buckets)
    assert len(fetch_files(announce_buckets("policy", 2, manifest, transport="files", uri=sender.version_uri(2)),
                           str(tmp_path / "staging")).files) == len(buckets)


@pytest.mark.broker
def test_a_full_disk_under_the_broadcast_files_stops_the_trainer_at_its_next_publish(kafka, namespace, tmp_path: Path):
    """The broadcast's files are written by its own thread: the failure reaches the trainer's next publish."""
    from undertow.streams import RecordProducer, Topics
    from undertow.streams.weights import BroadcastSender

    uri = limited(tmp_path / "weights", 1000)  # less than one bucket
    cfg = WeightsConfig(transport="broadcast", uri=uri, bucket_bytes=20_000, broadcast={"join_timeout_s": 0.1})
    with RecordProducer(kafka) as producer:
        sender = BroadcastSender(Sending("policy", cfg, producer, Topics(namespace), "full", kafka))
        buckets = sender.pack({"w": torch.zeros(4000)}, None)
        try:
            sender.publish(1, buckets)  # handed to the thread: the trainer trains on
            wait_for(lambda: sender.failure is not None, 30, what="the round's files")
            with pytest.raises(DiskFull, match="weights policy v1: no space left on the device"):
                sender.publish(2, buckets)
        finally:
            sender.close()
    assert files_under(tmp_path / "weights") == []  # nothing half written stays
