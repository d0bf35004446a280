"""Weights by files and by broadcast, without a broker: buckets, the version directory, fetching and
verifying, streaming into an engine, and every refusal leaving the engine's weights as they were."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
import torch

from undertow.kernel.models import ModelSpec, build_model, weights_to_bytes
from undertow.kernel.models.weights import load_weight_files, state_tensors, to_buckets
from undertow.rollout.engines import build_engine
from undertow.schemas import Bucket, WeightIntegrityError, announce_buckets
from undertow.streams.weights import (
    FilesSender, Sending, WeightsConfig, broadcast, check_announcement, fetch_files, manifest_of, transport_of,
)
from undertow.streams.weights import rendezvous, staging
from undertow.streams.weights.broadcast import receive_broadcast
from tests.helpers import wait_for


def files_sender(tmp_path, **cfg) -> FilesSender:
    config = WeightsConfig(transport="files", uri=str(tmp_path / "weights"), **cfg)
    return FilesSender(Sending("policy", config, producer=None, topics=None))


def written(sender: FilesSender, version: int, seed: int):
    """A version of a tiny model of `seed` written by the sender, and its announcement."""
    buckets = sender.pack(state_tensors(build_model(ModelSpec(seed=seed))), None)
    manifest = sender.write(version, buckets)
    return announce_buckets("policy", version, manifest, transport="files", uri=sender.version_uri(version))


def weights_of(engine) -> bytes:
    return weights_to_bytes(engine.model)


def test_buckets_hold_every_tensor_once_within_their_size():
    tensors = state_tensors(build_model(ModelSpec()))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    buckets = to_buckets(tensors, total // 4)
    assert len(buckets) >= 4
    names = [n for b in manifest_of(buckets) for n in (t.name for t in b.tensors)]
    assert sorted(names) == sorted(tensors) and len(names) == len(set(names))
    assert len(to_buckets(tensors, total + 1)) == 1


def test_a_files_version_round_trips_into_an_engine_bucket_by_bucket(tmp_path):
    sender = files_sender(tmp_path, bucket_bytes=20_000)
    update = written(sender, 1, seed=7)
    assert len(update.manifest) > 3
    staged = fetch_files(update, str(tmp_path))
    engine = build_engine("transformers", ModelSpec())
    assert weights_of(engine) != weights_to_bytes(build_model(ModelSpec(seed=7)))
    staged.load_into(engine)
    assert weights_of(engine) == weights_to_bytes(build_model(ModelSpec(seed=7)))
    assert not staged.directory.exists()  # the staging copy goes once loaded: at once under its name,
    wait_for(lambda: list(staged.directory.parent.glob(staged.directory.name + "*")) == [],  # then whole
             what="the staged files removed")


def test_versions_are_renamed_into_place_and_old_ones_collected(tmp_path):
    sender = files_sender(tmp_path, keep=2)
    for version in (1, 2, 3):
        written(sender, version, seed=version)
    root = tmp_path / "weights" / "policy"
    assert sorted(p.name for p in root.iterdir()) == ["v00000002", "v00000003"]
    assert (root / "v00000003" / "manifest.json").exists()
    # A trainer resumed from step 1's checkpoint: versions above it are from steps it lost.
    written(sender, 1, seed=1)
    assert sorted(p.name for p in root.iterdir()) == ["v00000001"]


def test_a_version_staged_before_collection_still_loads(tmp_path):
    sender = files_sender(tmp_path, keep=2)
    update = written(sender, 1, seed=7)
    staged = fetch_files(update, str(tmp_path))
    for version in (2, 3):  # v1 is collected while the worker still holds it staged
        written(sender, version, seed=version)
    assert not (tmp_path / "weights" / "policy" / "v00000001").exists()
    engine = build_engine("transformers", ModelSpec())
    staged.load_into(engine)
    assert weights_of(engine) == weights_to_bytes(build_model(ModelSpec(seed=7)))


def corrupt_bucket(update, tmp_path) -> None:
    path = tmp_path / "weights" / "policy" / f"v{update.version:08d}" / update.manifest[1].file
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def missing_bucket(update, tmp_path) -> None:
    (tmp_path / "weights" / "policy" / f"v{update.version:08d}" / update.manifest[-1].file).unlink()


@pytest.mark.parametrize(("spoil", "reason", "says"), [
    (corrupt_bucket, "checksum", "sha256"),
    (missing_bucket, "missing", "does not exist"),
])
def test_bad_files_are_refused_with_a_reason(tmp_path, spoil, reason, says):
    sender = files_sender(tmp_path, bucket_bytes=20_000)
    update = written(sender, 1, seed=7)
    spoil(update, tmp_path)
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(WeightIntegrityError, match=says) as e:
        fetch_files(update, str(staging))
    assert e.value.reason == reason
    assert list(staging.iterdir()) == []  # nothing half-staged is left behind


def test_a_manifest_that_does_not_describe_the_bytes_is_refused(tmp_path):
    sender = files_sender(tmp_path, bucket_bytes=20_000)
    update = written(sender, 1, seed=7)
    first = update.manifest[0]
    renamed = first.model_copy(update={"tensors": (first.tensors[0].model_copy(update={"name": "other"}),
                                                   *first.tensors[1:])})
    # Re-fingerprinted, so only the bytes can tell: the header names other tensors.
    lying = announce_buckets("policy", 1, [renamed, *update.manifest[1:]], transport="files", uri=update.uri)
    with pytest.raises(WeightIntegrityError, match="tensors differ from the manifest") as e:
        fetch_files(lying, str(tmp_path))
    assert e.value.reason == "manifest"
    resized = first.model_copy(update={"bytes": first.bytes + 1})
    tampered = update.model_copy(update={"manifest": (resized, *update.manifest[1:]),  # fingerprint kept
                                         "total_bytes": update.total_bytes + 1})
    with pytest.raises(WeightIntegrityError, match="manifest does not match"):
        fetch_files(tampered, str(tmp_path))


def test_tensors_that_are_not_the_models_are_refused_before_any_is_written(tmp_path):
    model = build_model(ModelSpec())
    before = weights_to_bytes(model)
    other = build_model(ModelSpec(seed=3, tiny={"n_embd": 32}))
    sender = files_sender(tmp_path, bucket_bytes=20_000)
    manifest = sender.write(1, sender.pack(state_tensors(other), None))
    paths = [tmp_path / "weights" / "policy" / "v00000001" / b.file for b in manifest]
    with pytest.raises(ValueError, match="has shape"):
        load_weight_files(model, paths)
    assert weights_to_bytes(model) == before


def test_loading_streams_into_the_models_dtype(tmp_path):
    model = build_model(ModelSpec()).to(torch.bfloat16)
    sender = files_sender(tmp_path)
    manifest = sender.write(1, sender.pack(state_tensors(build_model(ModelSpec(seed=7))), None))
    load_weight_files(model, [tmp_path / "weights" / "policy" / "v00000001" / b.file for b in manifest])
    source = build_model(ModelSpec(seed=7)).state_dict()
    for name, t in model.state_dict().items():
        assert t.dtype == torch.bfloat16
        assert torch.equal(t, source[name].to(torch.bfloat16))


def broadcast_round(store, buckets, version, expected, join_timeout_s=5.0, timeout_s=10.0, token="") -> dict:
    """What the trainer's broadcast thread does for one version, minus Kafka."""
    out: dict = {}

    def serve():
        members = rendezvous.close_membership(store, version, token, expected, join_timeout_s)
        out["size"], size = members.size, members.size
        try:
            if size > 1:
                rendezvous.send(rendezvous.group(store, members.prefix, 0, size, timeout_s), buckets)
                out["sent"] = True
        except Exception as e:
            out["error"] = e
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    out["thread"] = thread
    return out


def test_broadcast_delivers_a_version_to_the_workers_that_joined(tmp_path, monkeypatch):
    memory = tmp_path / "memory"  # stands for /dev/shm
    memory.mkdir()
    monkeypatch.setattr(staging, "MEMORY_ROOT", str(memory))
    disk = tmp_path / "staging"
    disk.mkdir()
    store = rendezvous.host_store("127.0.0.1", 0, 10)
    buckets = to_buckets(state_tensors(build_model(ModelSpec(seed=7))), 20_000)
    update = announce_buckets("policy", 4, manifest_of(buckets), transport="broadcast",
                              rendezvous=f"127.0.0.1:{store.port}")
    trainer = broadcast_round(store, buckets, 4, expected=2)
    results: list = [None, None]

    def worker(i):
        results[i] = receive_broadcast(update, 10, str(disk))
    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    trainer["thread"].join(30)
    assert trainer == {**trainer, "size": 3, "sent": True}
    # Staged in memory, not on the disk under the worker's staging directory.
    assert list(disk.iterdir()) == [] and {staged.directory.parent for staged in results} == {memory}
    for staged in results:
        engine = build_engine("transformers", ModelSpec())
        staged.load_into(engine)
        assert weights_of(engine) == weights_to_bytes(build_model(ModelSpec(seed=7)))
    # Late for a closed group: no place in it, and the files announcement brings the version.
    assert receive_broadcast(update, 10, str(disk)) is None


def test_a_worker_that_joins_and_dies_costs_the_sending_thread_a_timeout_not_training():
    store = rendezvous.host_store("127.0.0.1", 0, 10)
    ghost = rendezvous.connect(f"127.0.0.1:{store.port}", 10)
    rendezvous.attempt(ghost, 5, "")  # joined (with the run's token, none here), then never builds the group
    started = time.monotonic()
    trainer = broadcast_round(store, [b"x" * 100], 5, expected=1, timeout_s=2.0)
    trainer["thread"].join(30)
    assert trainer["size"] == 2 and "sent" not in trainer and trainer["error"] is not None
    assert time.monotonic() - started < 20  # its 2-s timeout, not the 30 s a hung send would take


def test_a_group_gloo_does_not_form_is_given_up_at_the_timeout(monkeypatch):
    """gloo's own connect once hung 300 s past its 60-s timeout (a worker SIGKILLed mid-round), holding
    back the files: however long gloo takes, the round gives up at `timeout_s`."""
    import torch.distributed as dist

    gloo = threading.Event()
    monkeypatch.setattr(dist, "ProcessGroupGloo", lambda *args: gloo.wait(120))  # a connect that hangs
    store = rendezvous.host_store("127.0.0.1", 0, 10)
    ghost = rendezvous.connect(f"127.0.0.1:{store.port}", 10)
    rendezvous.attempt(ghost, 6, "")
    started = time.monotonic()
    trainer = broadcast_round(store, [b"x" * 100], 6, expected=1, timeout_s=2.0)
    trainer["thread"].join(30)
    gloo.set()
    assert isinstance(trainer.get("error"), TimeoutError), trainer
    assert "not formed in 2 s" in str(trainer["error"]) and time.monotonic() - started < 10


def test_a_stranger_without_the_run_token_is_refused_and_a_member_gets_the_version(tmp_path):
    store = rendezvous.host_store("127.0.0.1", 0, 10)
    buckets = to_buckets(state_tensors(build_model(ModelSpec(seed=7))), 20_000)
    update = announce_buckets("policy", 7, manifest_of(buckets), transport="broadcast",
                              rendezvous=f"127.0.0.1:{store.port}")
    results: dict = {}

    def worker(name: str, token: str):
        try:
            results[name] = receive_broadcast(update, 10, str(tmp_path), token=token)
        except WeightIntegrityError as e:
            results[name] = e
    stranger = threading.Thread(target=worker, args=("stranger", "a guess"), daemon=True)
    stranger.start()  # first in: attempt 1, a proof made with another token
    wait_for(lambda: rendezvous.joined(store, 7) == 1, 10, "the stranger joined")
    trainer = broadcast_round(store, buckets, 7, expected=1, token="the run's secret")
    member = threading.Thread(target=worker, args=("member", "the run's secret"), daemon=True)
    member.start()
    for t in (member, stranger, trainer["thread"]):
        t.join(30)
    assert trainer == {**trainer, "size": 2, "sent": True}  # the trainer and the member only
    engine = build_engine("transformers", ModelSpec())
    results["member"].load_into(engine)
    assert weights_of(engine) == weights_to_bytes(build_model(ModelSpec(seed=7)))
    refused = results["stranger"]
    assert isinstance(refused, WeightIntegrityError) and refused.reason == "broadcast"
    assert "refused this worker's proof for v7: UNDERTOW_RUN_TOKEN is not the run's" in str(refused)


def test_a_routable_rendezvous_needs_the_run_token(monkeypatch):
    monkeypatch.delenv(rendezvous.TOKEN_ENV, raising=False)
    config = WeightsConfig(transport="broadcast", uri="/tmp/w", broadcast={"host": "0.0.0.0"})
    with pytest.raises(ValueError, match=r"broadcast.host \(0.0.0.0\) is reachable from other machines: set "
                                         r"UNDERTOW_RUN_TOKEN"):
        broadcast.BroadcastSender(Sending("policy", config, producer=None, topics=None))


def test_a_vanished_trainer_is_a_broadcast_refusal(tmp_path):
    store = rendezvous.host_store("127.0.0.1", 0, 10)
    buckets = [b"y" * 64]
    update = announce_buckets("policy", 6, manifest_of(to_buckets({"w": torch.zeros(16)}, 1 << 20)),
                              transport="broadcast", rendezvous=f"127.0.0.1:{store.port}")
    store.set("v6/members", '{"counted": 1, "admitted": [1]}')  # the group closed with this worker in it,
    # and the trainer never comes
    with pytest.raises(WeightIntegrityError, match="broadcast from .* failed") as e:
        receive_broadcast(update, 2, str(tmp_path))
    assert e.value.reason == "broadcast" and buckets


def test_a_trainer_whose_store_stopped_listening_is_refused_at_once(tmp_path):
    store = rendezvous.host_store("127.0.0.1", 0, 10)
    update = announce_buckets("policy", 6, manifest_of(to_buckets({"w": torch.zeros(16)}, 1 << 20)),
                              transport="broadcast", rendezvous=f"127.0.0.1:{store.port}")
    del store  # the trainer was SIGKILLed after it announced v6
    started = time.monotonic()
    with pytest.raises(WeightIntegrityError, match="Connection refused") as e:
        receive_broadcast(update, 60, str(tmp_path))
    # TCPStore alone retries a refused connection for twice its timeout (here 120 s): the worker's
    # weights thread would wait that long before it took the files of the next version.
    assert e.value.reason == "broadcast" and time.monotonic() - started < 5


def test_a_later_announcement_supersedes_earlier_ones_but_chunks_all_stay():
    from undertow.rollout.weight_subscriber import newest_announcements
    from undertow.schemas import chunk_weights

    def files(version: int, model: str = "policy"):
        return announce_buckets(model, version, manifest_of(to_buckets({"w": torch.zeros(2)}, 64)),
                                transport="files", uri="file:///w")

    chunks = chunk_weights("policy", 3, b"abcdefgh", 3)
    v1, v2, other, v4 = files(1), files(2), files(1, "other"), files(4)
    updates = [v1, chunks[0], v2, other, chunks[1], v4, chunks[2]]
    assert newest_announcements(updates) == [chunks[0], other, chunks[1], v4, chunks[2]]


def test_an_adapter_travels_as_one_bucket_and_is_applied_over_the_base(tmp_path):
    from undertow.kernel.models.adapters import LoraShape, adapter_tensors, wrap_lora

    policy = wrap_lora(build_model(ModelSpec()), LoraShape(rank=2, alpha=4.0))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.fill_(0.05)  # B = 0 would change nothing
    config = WeightsConfig(transport="files", uri=str(tmp_path / "weights"), bucket_bytes=64)
    sender = FilesSender(Sending("policy", config, producer=None, topics=None, payload="adapter"))
    manifest = sender.write(1, sender.pack(*adapter_tensors(policy)))
    assert len(manifest) == 1  # however small bucket_bytes: peft applies an adapter whole
    update = announce_buckets("policy", 1, manifest, transport="files", uri=sender.version_uri(1),
                              payload="adapter")
    engine = build_engine("transformers", ModelSpec())
    fetch_files(update, str(tmp_path)).load_into(engine)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.allclose(engine.model(ids).logits, policy(ids).logits, atol=1e-6)
        assert not torch.allclose(engine.model(ids).logits, build_model(ModelSpec())(ids).logits, atol=1e-3)


@pytest.mark.parametrize(("transport", "fields", "says"), [
    ("files", {"uri": None}, "transport files needs uri"),
    ("broadcast", {"uri": None}, "transport broadcast needs rendezvous"),
    ("files", {"rendezvous": "h:1"}, "transport files takes no rendezvous"),
    ("kafka", {"manifest": None, "uri": None, "total_bytes": 0}, "transport kafka needs data"),
])
def test_what_an_announcement_carries_is_its_transports_to_say(transport, fields, says):
    """The schema lets these through (a transport it does not know may carry anything); the receiving
    end refuses them, as the rejected topic's `invalid`, before it fetches anything."""
    update = announce_buckets("policy", 1, manifest_of(to_buckets({"w": torch.zeros(2)}, 64)), transport=transport,
                              uri="file:///w")
    update = update.model_copy(update=fields)
    with pytest.raises(WeightIntegrityError, match=says) as e:
        check_announcement(update, transport_of(transport), transport)
    assert e.value.reason == "invalid"
    check_announcement(announce_buckets("policy", 1, [], transport="broadcast", rendezvous="h:1", uri="file:///w"),
                       transport_of("broadcast"), "broadcast")  # broadcast may name its files too


def test_a_broadcast_version_is_staged_in_memory_only_where_it_fits(tmp_path, monkeypatch):
    memory = tmp_path / "memory"
    memory.mkdir()
    monkeypatch.setattr(staging, "MEMORY_ROOT", str(memory))
    room = staging.memory_room()
    assert 0 < room <= shutil.disk_usage(memory).free

    def version(total: int):
        bucket = Bucket(file="bucket-0000.safetensors", bytes=total, sha256="0" * 64, tensors=())
        return announce_buckets("policy", 1, [bucket], transport="broadcast", rendezvous="127.0.0.1:1")
    assert staging.in_memory(version(room // 4), "/staging") == str(memory)
    assert staging.in_memory(version(room // 2 + 1), "/staging") == "/staging"  # twice over does not fit
    monkeypatch.setattr(staging, "MEMORY_ROOT", str(tmp_path / "none"))  # no tmpfs on this system
    assert staging.in_memory(version(1), "/staging") == "/staging"


def test_a_broadcast_bucket_not_the_announced_one_refuses_the_version_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(staging, "MEMORY_ROOT", str(tmp_path / "none"))  # staged under tmp_path: we can look
    store = rendezvous.host_store("127.0.0.1", 0, 10)
    buckets = to_buckets(state_tensors(build_model(ModelSpec(seed=7))), 20_000)
    update = announce_buckets("policy", 4, manifest_of(buckets), transport="broadcast",
                              rendezvous=f"127.0.0.1:{store.port}")
    sent = list(buckets)
    sent[1] = bytes(sent[1][:-1]) + bytes([sent[1][-1] ^ 1])  # one bit of the second bucket flipped on the way
    trainer = broadcast_round(store, sent, 4, expected=1, timeout_s=1.0)
    with pytest.raises(WeightIntegrityError, match="bucket-0001.safetensors: sha256") as e:
        receive_broadcast(update, 3, str(tmp_path))
    trainer["thread"].join(30)  # its send times out: the worker left
    assert e.value.reason == "checksum" and list(tmp_path.iterdir()) == []


def test_memory_staging_removes_what_killed_workers_left(tmp_path, monkeypatch):
    memory = tmp_path / "memory"
    memory.mkdir()
    monkeypatch.setattr(staging, "MEMORY_ROOT", str(memory))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = memory / f"undertow-policy-v3-p{int(gone.stdout)}-k2j4x9"  # a worker SIGKILLed with v3 staged
    live = memory / f"undertow-policy-v4-p{os.getpid()}-a8b7c6"  # ours, being received
    for folder in (dead, live):
        folder.mkdir()
        (folder / "bucket-0000.safetensors").write_bytes(b"x" * 100)
    update = announce_buckets("policy", 5, [Bucket(file="bucket-0000.safetensors", bytes=1, sha256="0" * 64,
                                                   tensors=())], transport="broadcast", rendezvous="127.0.0.1:1")
    assert staging.in_memory(update, "/staging") == str(memory)
    assert sorted(memory.iterdir()) == [live]
