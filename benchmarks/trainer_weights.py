"""Weight broadcast: trainer publish -> a worker holding the reassembled, verified blob, against a raw
kafka-python producer -> consumer moving the same bytes in the same chunk sizes on the same broker.

    UNDERTOW_BOOTSTRAP=host:port python benchmarks/trainer_weights.py [--n-embd 512 --n-layer 4]
"""

from __future__ import annotations

import argparse
import time
import uuid

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from schemas import ModelSpec, TinyModel, WeightUpdate, assemble_weights, decode
from schemas.model import build_model, weights_to_bytes
from streams import KafkaSettings, RecordProducer, Topics, create_topics
from streams.topics import MAX_MESSAGE_BYTES
from trainer.publish import publish_weights, weight_updates


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-embd", type=int, default=512)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--chunk-bytes", type=int, default=4 << 20)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    settings = KafkaSettings().with_env()
    spec = ModelSpec(tiny=TinyModel(n_embd=args.n_embd, n_layer=args.n_layer, n_head=8))
    blob = weights_to_bytes(build_model(spec))
    ours, raw = [], []
    for r in range(args.repeats):  # fresh topics each round: each consumer reads exactly one version
        topics = Topics(f"bench-{uuid.uuid4().hex[:8]}")
        create_topics(settings, topics.namespace)
        ours.append(undertow_round(settings, topics, blob, args.chunk_bytes, r))
        raw.append(raw_round(settings, topics.metrics, blob, args.chunk_bytes))  # 1 partition, same configs
    best_ours, best_raw = min(ours), min(raw)
    print(f"weights: {len(blob) / 2**20:.1f} MiB in {-(-len(blob) // args.chunk_bytes)} chunks of "
          f"{args.chunk_bytes / 2**20:.0f} MiB")
    print(f"publish -> reassembled and verified: {best_ours:.3f} s (best of {args.repeats})")
    print(f"raw kafka-python producer -> consumer: {best_raw:.3f} s")
    print(f"ratio: {best_ours / best_raw:.2f}x (target <= 2x)")


if __name__ == "__main__":
    main()
