"""Re-running new processors over history: archive raw experiences, replay them into a new namespace,
process them there with another pipeline, in one go and without a restart.

    python benchmarks/reprocess_throughput.py [--records 200000] [--bootstrap host:port]

`--records` ~1 KB raw experiences (groups of 8) are published to a source namespace, archived to
Parquet (the Archiver, in process), replayed from the archive with the `unprocessed` shape into a
fresh namespace's experiences.raw, and drained there by one `undertow process` worker running a
pipeline the records never went through (clean, RLOO advantages, prioritize). Prints rows/s of each
step and the worker's records/s against the raw passthrough measured over the same replayed records.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from benchmarks.processors_throughput import GROUP, publish, reference, shut_down, worker_run  # noqa: E402
from undertow.infra.broker.local import LocalKafka, free_port_block  # noqa: E402
from undertow.streams import KafkaSettings, RecordProducer, RunContext, Topics, create_topics  # noqa: E402
from undertow.streams.archive import ArchiveConfig, Archiver  # noqa: E402
from undertow.streams.history import History  # noqa: E402
from undertow.streams.replay import Selection, replay  # noqa: E402

PIPELINE = ["clean", {"name": "reshape", "advantage": "rloo"}, "prioritize"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--bootstrap", default=os.environ.get("UNDERTOW_BOOTSTRAP"))
    args = ap.parse_args()
    broker = None
    if not args.bootstrap:
        broker = LocalKafka(Path(tempfile.mkdtemp()), port=free_port_block(2)).start()
        args.bootstrap = broker.bootstrap_servers
    kafka = KafkaSettings(bootstrap_servers=args.bootstrap)
    tag = uuid.uuid4().hex[:6]
    source, target = f"hist-{tag}", f"reproc-{tag}"
    create_topics(kafka, source)
    create_topics(kafka, target)
    work = Path(tempfile.mkdtemp())
    records = args.records // GROUP * GROUP
    worker = None
    try:
        publish(kafka, Topics(source).raw, 0, records // GROUP)
        t = time.monotonic()
        archived = Archiver(ArchiveConfig(root=str(work / "archive"), topics=["experiences.raw"]), RunContext(namespace=source, kafka=kafka)).run(
            lambda: False, max_records=records)
        archive_s = time.monotonic() - t
        print(f"archived {archived.rows} rows in {archive_s:.1f} s ({archived.rows / archive_s:.0f} rows/s)", flush=True)
        with RecordProducer(kafka, linger_ms=20, batch_size=1 << 20) as producer:
            sent = replay(History.from_archive(str(work / "archive"), [source]), Selection(view="raw"), "unprocessed",
                          producer, Topics(target).raw)
        print(f"replayed {sent.sent} records into {Topics(target).raw} in {sent.seconds:.1f} s "
              f"({sent.records_per_s:.0f} records/s)", flush=True)
        assert sent.sent == records, f"replayed {sent.sent} of {records}"
        result: dict = {"records": records, "passthrough": reference(kafka, Topics(target).raw, records)}
        print(result, flush=True)
        config = work / "reprocess.yaml"
        config.write_text(yaml.safe_dump({"namespace": target, "kafka": {"bootstrap_servers": args.bootstrap},
                                          "processors": {"app_id": f"proc-{target}", "pipeline": PIPELINE}}))
        result["worker"], worker = worker_run(kafka, Topics(target), config, records, f"proc-{target}",
                                              work / "worker.log")
        print(result, flush=True)
        w, ref = result["worker"], result["passthrough"]
        print(f"reprocessing worker = {100 * w['per_s'] / ref['per_s']:.0f}% of raw passthrough "
              f"({w['per_s']} vs {ref['per_s']} records/s); resyncs {w['resyncs']}, restarts 0 "
              f"(the worker ran as one process to the end)", flush=True)
    finally:
        shut_down(worker, broker)


if __name__ == "__main__":
    main()
