"""Read back what the metric sinks wrote, with each library's own reader (W&B's offline log by its format)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

Point = tuple[str, int, float]  # (tag, step, value)


def tensorboard_points(logdir: Path) -> list[Point]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    return sorted((tag, e.step, e.value) for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag))


def mlflow_points(directory: Path, experiment: str, stage: str) -> list[Point]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(directory / "mlruns").resolve().as_uri())
    exp = client.get_experiment_by_name(experiment)
    (run,) = client.search_runs([exp.experiment_id], filter_string=f"tags.`undertow.stage` = '{stage}'")
    return sorted((key, m.step, m.value) for key in run.data.metrics
                  for m in client.get_metric_history(run.info.run_id, key))


def wandb_rows(directory: Path) -> list[dict]:
    """The history rows of every offline run under `directory`/wandb, from the .wandb files: a
    LevelDB-style log (7-byte file header, 32 KiB blocks, records of crc32, length, type) of protobufs."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for path in sorted(directory.glob("wandb/offline-run-*/run-*.wandb")):
        data, pos, pending = path.read_bytes(), 7, b""
        assert data[:4] == b":W&B", path
        while pos + 7 <= len(data):
            room = 32768 - pos % 32768
            if room < 7:  # a block's tail too short for a header is padding
                pos += room
                continue
            _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            if kind == 0:  # zero-filled rest of a block
                pos += room
                continue
            pending += data[pos + 7:pos + 7 + length]
            pos += 7 + length
            if kind in (1, 4):  # a full record, or the last piece of one
                record = pb.Record()
                record.ParseFromString(pending)
                pending = b""
                if record.WhichOneof("record_type") == "history":
                    rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


def wandb_points(directory: Path) -> list[Point]:
    return sorted((k, row["policy_version"], float(v)) for row in wandb_rows(directory) for k, v in row.items()
                  if not k.startswith("_") and k != "policy_version")
