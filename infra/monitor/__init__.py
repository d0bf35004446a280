"""The monitor component: metric events from the metrics topic into TensorBoard, W&B, MLflow, or a user's sink."""

from undertow.infra.monitor.sinks import MissingExtra, Scalar, Sink, SinkContext, sinks
from undertow.infra.monitor import mlflow_sink, tensorboard_sink, wandb_sink  # noqa: F401 (register the built-ins)
from undertow.infra.monitor.config import MonitorConfig
from undertow.infra.monitor.component import Monitor, MonitorStats

__all__ = ["MissingExtra", "Monitor", "MonitorConfig", "MonitorStats", "Scalar", "Sink", "SinkContext", "sinks"]
