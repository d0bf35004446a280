"""Weight broadcast: trainer publish -> a worker holding the reassembled, verified blob, against a raw
kafka-python producer -> consumer moving the same bytes in the same chunk sizes on the same broker.

    python benchmarks/trainer_weights.py [--config examples/demo.yaml] [--repeats 5]

The model and chunk size come from the config (the demo's by default). A LocalKafka of its own is
started unless $UNDERTOW_BOOTSTRAP names a cluster.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kafka import KafkaConsumer, KafkaProducer, TopicPartition  # noqa: E402

from benchmarks.broker import benchmark_cluster  # noqa: E402
from kernel.config_io import load_config  # noqa: E402
from kernel.models import build_model, weights_to_bytes  # noqa: E402
from schemas import WeightUpdate, assemble_weights, decode  # noqa: E402
from streams import KafkaSettings, RecordProducer, Topics, create_topics  # noqa: E402
from streams.topics import MAX_MESSAGE_BYTES  # noqa: E402
from trainer.config import TrainRunConfig  # noqa: E402
from trainer.publish import publish_weights, weight_updates  # noqa: E402


def consume(settings: KafkaSettings, topic: str, count: int) -> list[bytes]:
    consumer = KafkaConsumer(**settings.kafka_python(), enable_auto_commit=False, fetch_max_bytes=64 << 20,
                             max_partition_fetch_bytes=32 << 20)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    values: list[bytes] = []
    while len(values) < count:
        for messages in consumer.poll(timeout_ms=1000).values():
            values.extend(m.value for m in messages)
    consumer.close()
    return values


def undertow_round(settings: KafkaSettings, topics: Topics, blob: bytes, chunk_bytes: int, version: int) -> float:
    started = time.perf_counter()
    with RecordProducer(settings) as producer:
        updates = weight_updates("bench", version, blob, chunk_bytes=chunk_bytes, weights_dir=None, uri_above_bytes=0)
        publish_weights(producer, topics.weights, updates)
    values = consume(settings, topics.weights, len(updates))
    got = assemble_weights(decode(v, expect=WeightUpdate) for v in values)
    assert got == blob
    return time.perf_counter() - started


def raw_round(settings: KafkaSettings, topic: str, blob: bytes, chunk_bytes: int) -> float:
    started = time.perf_counter()
    producer = KafkaProducer(**settings.kafka_python(), acks="all", max_request_size=MAX_MESSAGE_BYTES)
    chunks = [blob[i:i + chunk_bytes] for i in range(0, len(blob), chunk_bytes)]
    for c in chunks:
        producer.send(topic, c, key=b"bench")
    producer.flush()
    producer.close()
    assert b"".join(consume(settings, topic, len(chunks))) == blob
    return time.perf_counter() - started


def measure(settings: KafkaSettings, blob: bytes, chunk_bytes: int, repeats: int) -> tuple[float, float]:
    """Best-of-`repeats` seconds: undertow's broadcast, then the raw reference."""
    ours, raw = [], []
    for r in range(repeats):  # fresh topics each round: each consumer reads exactly one version
        topics = Topics(f"bench-{uuid.uuid4().hex[:8]}")
        create_topics(settings, topics.namespace)
        ours.append(undertow_round(settings, topics, blob, chunk_bytes, r))
        raw.append(raw_round(settings, topics.metrics, blob, chunk_bytes))  # 1 partition, same configs
    return min(ours), min(raw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=ROOT / "examples" / "demo.yaml",
                    help="run config: its model is broadcast, in its trainer.chunk_bytes chunks")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    cfg = load_config(args.config, TrainRunConfig)
    blob = weights_to_bytes(build_model(cfg.model))
    chunk_bytes = cfg.trainer.chunk_bytes
    with tempfile.TemporaryDirectory() as tmp, benchmark_cluster(Path(tmp)) as settings:
        best_ours, best_raw = measure(settings, blob, chunk_bytes, args.repeats)
    print(f"weights of {args.config.name}'s model: {len(blob) / 2**20:.2f} MiB in {-(-len(blob) // chunk_bytes)} "
          f"chunk(s) of up to {chunk_bytes / 2**20:.0f} MiB")
    print(f"publish -> reassembled and verified: {best_ours:.3f} s (best of {args.repeats})")
    print(f"raw kafka-python producer -> consumer, same bytes: {best_raw:.3f} s (best of {args.repeats})")
    print(f"ratio undertow / raw: {best_ours / best_raw:.2f}x (target <= 2x)")


if __name__ == "__main__":
    main()
