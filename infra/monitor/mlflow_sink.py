"""MLflow: a local file store under <run dir>/mlruns by default, or any tracking URI."""

from __future__ import annotations

import os
import time

from undertow.infra.monitor.sinks import Scalar, SinkContext, needs_extra, sinks

STAGE_TAG = "undertow.stage"


@sinks.register("mlflow")
class MlflowSink:
    """One MLflow run per stage in an experiment named after the run; a restart continues that run."""

    def __init__(self, context: SinkContext, *, tracking_uri: str | None = None, experiment: str | None = None):
        uri = tracking_uri or (context.directory / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):
            # MLflow 3 refuses file stores unless told; the database stores need SQLAlchemy, which
            # mlflow-skinny leaves out, and a run directory should stay plain files.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        with needs_extra("mlflow"):
            from mlflow import tracking
            from mlflow.entities import Metric
        self._metric = Metric
        self.client = tracking.MlflowClient(tracking_uri=uri)
        name = experiment or context.run
        found = self.client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found else self.client.create_experiment(name)
        earlier = self.client.search_runs([experiment_id], filter_string=f"tags.`{STAGE_TAG}` = '{context.stage}'")
        self.run_id = earlier[0].info.run_id if earlier else self.client.create_run(
            experiment_id, run_name=context.stage,
            tags={STAGE_TAG: context.stage, "undertow.namespace": context.namespace}).info.run_id
        if earlier:
            self.client.update_run(self.run_id, status="RUNNING")
        self.pending: list = []

    def write(self, scalars: list[Scalar]) -> None:
        self.pending += [self._metric(s.tag, s.value, int(s.time * 1000), s.step) for s in scalars]

    def flush(self) -> None:
        for i in range(0, len(self.pending), 1000):  # MLflow takes at most 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=self.pending[i:i + 1000])
        self.pending = []

    def close(self) -> None:
        self.flush()
        self.client.set_terminated(self.run_id, end_time=int(time.time() * 1000))
