"""A Faust worker that relays every valid record from <ns>.experiences.raw to <ns>.experiences.ready.

Run as `python -m tests.streams.faust_relay APP_ID NAMESPACE` (bootstrap from $UNDERTOW_BOOTSTRAP).
"""

from __future__ import annotations

import sys

import faust
from faust.worker import Worker

from undertow.schemas import record_types
from undertow.streams import KafkaSettings, Topics
from undertow.streams.faust import RecordIO, create_app


def build(app_id: str, namespace: str) -> faust.App:
    app = create_app(app_id, KafkaSettings().with_env())
    topics = Topics(namespace)
    io = RecordIO(app, topics, stage="relay")

    @app.agent(io.topic(topics.raw))
    async def relay(stream):
        async for event in stream.events():
            record = await io.decode(event, expect=tuple(record_types().values()))
            if record is not None:
                await io.send(topics.ready, record, key=event.key)

    return app


if __name__ == "__main__":
    Worker(build(sys.argv[1], sys.argv[2]), loglevel="warning").execute_from_commandline()
