"""Topic creation against the real broker."""

from __future__ import annotations

import uuid

import pytest
from kafka import KafkaAdminClient
from kafka.errors import UnknownBrokerIdError

from undertow.streams import CATALOG, create_topics, list_topics

pytestmark = pytest.mark.broker


def test_a_controller_not_yet_in_the_clients_metadata_is_waited_for(kafka, monkeypatch):
    """What a 3-broker cluster can answer just after it starts: seen once in CI, at the first create."""
    real, calls = KafkaAdminClient.create_topics, []

    def first_knows_no_controller(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise UnknownBrokerIdError(3)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(KafkaAdminClient, "create_topics", first_knows_no_controller)
    ns = f"admin-{uuid.uuid4().hex[:8]}"
    created = create_topics(kafka, ns)
    assert len(calls) == 2
    assert created == list_topics(kafka, ns) and len(created) == len(CATALOG)
    assert create_topics(kafka, ns) == []  # a second call finds them all
