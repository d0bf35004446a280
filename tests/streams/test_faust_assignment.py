"""How Faust's assignor deals the raw partitions among processor workers, with the app's settings."""

from __future__ import annotations

from faust.assignor.client_assignment import CopartitionedAssignment
from faust.assignor.copartitioned_assignor import CopartitionedAssignor

from undertow.streams import KafkaSettings
from undertow.streams.faust.app import create_app


def actives_after_a_third_worker_joins(replicas: int) -> dict[str, set[int]]:
    """p1 and p2 held the 4 raw partitions two each (p2 had been p1's standby for 0 and 1); p3 joins."""
    held = {"p1": CopartitionedAssignment(actives={2, 3}, standbys={0, 1}, topics={"raw"}),
            "p2": CopartitionedAssignment(actives={0, 1}, standbys={2, 3}, topics={"raw"}),
            "p3": CopartitionedAssignment(topics={"raw"})}
    dealt = CopartitionedAssignor({"raw"}, held, num_partitions=4, replicas=replicas).get_assignment()
    return {client: assignment.actives for client, assignment in dealt.items()}


def test_a_worker_that_joins_gets_raw_partitions_to_process():
    app = create_app("assignment", KafkaSettings(bootstrap_servers="127.0.0.1:9"))  # never connected
    app.finalize()  # its settings, as a worker reads them
    dealt = actives_after_a_third_worker_joins(app.conf.table_standby_replicas)
    assert all(dealt.values()) and set().union(*dealt.values()) == {0, 1, 2, 3}, dealt
    # Faust's default, one standby per table, keeps p1's and p2's two each: p3 would sit idle for good
    # (seen once in tests/infra/test_elastic_processors.py: 300 s Stable at 2/2/0).
    assert actives_after_a_third_worker_joins(1)["p3"] == set()
