"""A job call's state changes reach the changelog only once the outputs of that call are acknowledged
(streams/faust/tables.py says why: ahead of them, a worker killed in between would take the records it
reads again for duplicates of outputs the broker never got, and reject them)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from undertow.streams.faust import Send, TableStore
from undertow.streams.faust.worker import JobCalls, send_all


class Producer:
    """Faust's producer as the worker uses it: `send` enqueues, its future resolves on acknowledgement."""

    def __init__(self, log: list):
        self.log, self.unacked = log, []

    async def send(self, topic, key, value, partition, *rest):
        self.log.append((topic, key, partition) if topic.endswith("changelog") else ("sent", value))
        self.unacked.append(asyncio.get_running_loop().create_future())
        return self.unacked[-1]


def table(producer: Producer) -> SimpleNamespace:
    """What TableStore asks of a Faust table: its local data, its changelog topic, the app's producer."""
    return SimpleNamespace(data={}, app=SimpleNamespace(producer=producer),
                           changelog_topic=SimpleNamespace(get_topic_name=lambda: "proc-dedupe-changelog"))


@pytest.mark.parametrize("off_loop", [False, True])
def test_a_calls_changes_go_to_the_changelog_after_its_outputs_are_acknowledged(off_loop):
    log: list = []
    producer = Producer(log)
    store = TableStore(table(producer), partitions=4)
    io = SimpleNamespace(app=SimpleNamespace(producer=producer))

    def handle(batch):
        store.put(b"seen:" + batch[0], b"1", route=b"group-7")
        store.delete(b"open:group-7", route=b"group-7")
        return [Send("ready", b"group-7", batch[0])]

    async def main():
        outputs, changes = await JobCalls([store], off_loop=off_loop)(handle, [b"x"])
        assert store.changes == [] and store.table.data == {b"seen:x": b"1"}  # taken with the call, kept locally
        sending = asyncio.ensure_future(send_all(io, "raw", outputs, changes))
        while not producer.unacked:
            await asyncio.sleep(0)
        assert log == [("sent", b"x")]  # the output is out, unacknowledged: no change has followed it
        producer.unacked[0].set_result(None)
        await sending

    asyncio.run(main())
    partition = store.partition_of(b"group-7")
    assert log == [("sent", b"x"), ("proc-dedupe-changelog", b"seen:x", partition),
                   ("proc-dedupe-changelog", b"open:group-7", partition)]
