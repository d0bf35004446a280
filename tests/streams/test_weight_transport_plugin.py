"""Adding a transport is one module and a registration: this one carries a version's safetensors blob
as one file in a local directory. Through the real sender the trainer builds from its config, the real
WeightSubscriber and the real broker: a good version is loaded, a corrupted one refused with a reason."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from undertow.infra.run.config import RunConfig
from undertow.kernel.models import ModelSpec, build_model, weights_to_bytes
from undertow.kernel.models.weights import state_tensors
from undertow.rollout.engines import build_engine
from undertow.rollout.weight_subscriber import WeightSubscriber
from undertow.schemas import Rejected, WeightUpdate, verify_weights
from undertow.streams import RecordProducer, Topics
from undertow.streams.weights import (
    Assembled, Lost, Published, Receiving, Sending, Transport, WeightsConfig, build_sender, publish_weights, transports,
)
from tests.helpers import read_all, wait_for

pytestmark = [pytest.mark.broker]


# -- the whole transport ------------------------------------------------------------------------

class OneFileSender:
    def __init__(self, sending: Sending):
        self.s = sending

    def pack(self, tensors: dict[str, Any], metadata: dict[str, str] | None) -> bytes:
        from safetensors.torch import save

        return save(tensors, metadata=metadata)

    def publish(self, version: int, packed: bytes) -> Published:
        path = Path(self.s.cfg.uri) / f"{self.s.model}-v{version}.safetensors"
        path.write_bytes(packed)
        update = WeightUpdate(model=self.s.model, version=version, transport="one_file", uri=str(path),
                              total_bytes=len(packed), sha256=hashlib.sha256(packed).hexdigest(),
                              payload=self.s.payload, tokenizer=self.s.tokenizer)
        return publish_weights(self.s.producer, self.s.topics.weights, [update])

    def close(self) -> None:
        pass


class OneFileReceiver:
    def __init__(self, receiving: Receiving):
        self.r = receiving

    def receive(self, update: WeightUpdate) -> Assembled:
        blob = Path(update.uri).read_bytes()
        verify_weights(blob, update)  # WeightIntegrityError("checksum") unless it is the announced blob
        return Assembled(update.model, update.version, blob)

    def lost(self) -> list[Lost]:
        return []


@transports.register("one_file")
class OneFile(Transport):
    needs = ("uri",)
    sender, receiver = OneFileSender, OneFileReceiver

    @classmethod
    def check_settings(cls, cfg: Any, name: str) -> None:
        if cfg.uri is None:
            raise ValueError(f"uri: transport {name} writes its file there")


# -- the test -----------------------------------------------------------------------------------

def test_the_config_knows_the_new_transport_by_its_registration():
    assert RunConfig.model_validate({"trainer": {"weights": {"transport": "one_file", "uri": "/w"}}})
    with pytest.raises(ValidationError, match="uri: transport one_file writes its file there"):
        RunConfig.model_validate({"trainer": {"weights": {"transport": "one_file"}}})
    with pytest.raises(ValidationError) as e:
        RunConfig.model_validate({"trainer": {"weights": {"transport": "one_fil"}}})
    assert "trainer.weights.transport" in str(e.value) and "'one_file'" in str(e.value)


def test_a_transport_registered_in_one_module_goes_end_to_end(kafka, namespace, tmp_path):
    topics = Topics(namespace)
    cfg = WeightsConfig(transport="one_file", uri=str(tmp_path))
    engine = build_engine("transformers", ModelSpec())
    with RecordProducer(kafka) as producer:
        subscriber = WeightSubscriber(kafka, topics, "policy", producer)
        subscriber.start()
        sender = build_sender(Sending("policy", cfg, producer, topics, "full", kafka))
        try:
            assert subscriber.caught_up.wait(30)
            sender.publish(1, sender.pack(state_tensors(build_model(ModelSpec(seed=7))), None))
            ready = wait_for(subscriber.take, what="v1")
            assert subscriber.load(ready, engine) is not None
            assert weights_to_bytes(engine.model) == weights_to_bytes(build_model(ModelSpec(seed=7)))

            good = sender.pack(state_tensors(build_model(ModelSpec(seed=8))), None)
            path = tmp_path / "policy-v2.safetensors"
            path.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # one bit flipped on the way
            announced = dict(model="policy", version=2, transport="one_file", total_bytes=len(good),
                             sha256=hashlib.sha256(good).hexdigest())
            publish_weights(producer, topics.weights, [WeightUpdate(**announced, uri=str(path))])
            wait_for(lambda: subscriber.refused == [2], what="v2 refused")
            publish_weights(producer, topics.weights, [WeightUpdate(**{**announced, "version": 3})])  # no uri
            wait_for(lambda: subscriber.refused == [2, 3], what="v3 refused")
            unknown = {**announced, "version": 4, "transport": "pigeon"}  # never registered here
            publish_weights(producer, topics.weights, [WeightUpdate(**unknown, uri=str(path))])
            wait_for(lambda: subscriber.refused == [2, 3, 4], what="v4 refused")
            assert subscriber.take() is None
        finally:
            sender.close()
            subscriber.stop()
    assert weights_to_bytes(engine.model) == weights_to_bytes(build_model(ModelSpec(seed=7)))
    refused = [r for r in read_all(kafka, topics.rejected, Rejected) if r.stage == "weights"]
    assert [(r.record_id, r.reason) for r in refused] == [
        ("policy@v2", "checksum"), ("policy@v3", "invalid"), ("policy@v4", "invalid")]
    assert "transport one_file needs uri" in refused[1].detail and "'pigeon' is not registered" in refused[2].detail
    assert {u.transport for u in read_all(kafka, topics.weights, WeightUpdate)} == {"one_file", "pigeon"}
