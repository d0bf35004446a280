"""Archive write throughput and replay throughput (rows/s) on a local broker.

    python benchmarks/history_throughput.py [--groups 2500] [--response-tokens 128]

Produces `groups` × 4 experiences to a fresh namespace, archives them (Archiver, in process, flushes
of 2,000 rows), then replays all of them as_is from the archive into a second namespace.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from undertow.infra.broker.local import LocalKafka, free_port_block  # noqa: E402
from undertow.schemas import Experience  # noqa: E402
from undertow.streams import KafkaSettings, RecordProducer, RunContext, Topics, create_topics  # noqa: E402
from undertow.streams.archive import ArchiveConfig, Archiver  # noqa: E402
from undertow.streams.history import History  # noqa: E402
from undertow.streams.replay import Selection, replay  # noqa: E402


def experiences(groups: int, tokens: int) -> list[Experience]:
    return [Experience(experience_id=f"g{g}/{i}", task_id=f"g{g}", group_id=f"g{g}", group_size=4, sample_index=i,
                       prompt_text="x" * 64, prompt_tokens=list(range(64)), response_text="y" * tokens,
                       response_tokens=list(range(tokens)), behaviour_logprobs=[-0.5] * tokens,
                       reward=float(i == 0), advantages=[0.1] * tokens, policy_version=g // 10, finish_reason="stop")
            for g in range(groups) for i in range(4)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, default=2500)
    parser.add_argument("--response-tokens", type=int, default=128)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        broker = None
        if not os.environ.get("UNDERTOW_BOOTSTRAP"):
            broker = LocalKafka(Path(tmp) / "kafka", port=free_port_block(2)).start()
        kafka = KafkaSettings(bootstrap_servers=broker.bootstrap_servers) if broker else KafkaSettings().with_env()
        try:
            source, target = f"bench-{int(time.time())}", f"bench-{int(time.time())}-replay"
            create_topics(kafka, source)
            create_topics(kafka, target)
            records = experiences(args.groups, args.response_tokens)
            with RecordProducer(kafka) as producer:
                for r in records:
                    producer.send(Topics(source).ready, r, key=r.group_id)
            cfg = ArchiveConfig(root=str(Path(tmp) / "archive"), topics=["experiences.ready"])
            stats = Archiver(cfg, RunContext(namespace=source, kafka=kafka)).run(lambda: False, max_records=len(records))
            print(f"archive: {stats.rows} rows in {stats.files} files, {stats.seconds:.2f} s, {stats.rows_per_s:.0f} rows/s")
            history = History.from_archive(cfg.root, [source])
            with RecordProducer(kafka) as producer:
                result = replay(history, Selection(), "as_is", producer, Topics(target).ready)
            print(f"replay: {result.sent} records in {result.seconds:.2f} s, {result.records_per_s:.0f} records/s")
        finally:
            if broker:
                broker.stop()


if __name__ == "__main__":
    main()
