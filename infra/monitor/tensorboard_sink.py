"""TensorBoard: event files under <run dir>/tensorboard/<stage>/ (`tensorboard --logdir <run dir>/tensorboard`)."""

from __future__ import annotations

from undertow.infra.monitor.sinks import Scalar, SinkContext, needs_extra, sinks


@sinks.register("tensorboard")
class TensorBoardSink:
    """One TensorBoard run per stage; each metric a scalar series over policy versions."""

    def __init__(self, context: SinkContext, *, subdir: str = "tensorboard"):
        with needs_extra("tensorboard"):
            from tensorboard.compat.proto import event_pb2, summary_pb2
            from tensorboard.summary.writer import event_file_writer as writer
        self._pb, self._event = summary_pb2, event_pb2.Event
        self.logdir = context.directory / subdir / context.stage
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._writer = writer.EventFileWriter(str(self.logdir))

    def write(self, scalars: list[Scalar]) -> None:
        summary = self._pb.Summary
        for s in scalars:
            value = summary.Value(tag=s.tag, simple_value=s.value)
            self._writer.add_event(self._event(wall_time=s.time, step=s.step, summary=summary(value=[value])))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
