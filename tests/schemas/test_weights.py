"""Weight chunks: split and join in any order, and refuse anything that does not add up."""

import hashlib
import random

import pytest
from pydantic import ValidationError

from undertow.schemas import (
    WeightIntegrityError,
    WeightUpdate,
    assemble_weights,
    chunk_weights,
    decode,
    encode,
    from_arrow,
    to_arrow,
    announce_buckets,
    verify_manifest,
    verify_weights,
)
from undertow.schemas.weights import Bucket, TensorMeta, manifest_digest

BLOB = bytes(range(256)) * 4 + b"tail"  # 1028 bytes
SHA = hashlib.sha256(BLOB).hexdigest()


@pytest.mark.parametrize(
    ("chunk_bytes", "expected_chunks"), [(1, 1028), (100, 11), (514, 2), (1028, 1), (4096, 1)]
)
def test_chunk_then_assemble(chunk_bytes, expected_chunks):
    chunks = chunk_weights("tiny", 7, BLOB, chunk_bytes)
    assert len(chunks) == expected_chunks
    headers = {(c.num_chunks, c.total_bytes, c.sha256, c.version) for c in chunks}
    assert headers == {(expected_chunks, 1028, SHA, 7)}
    assert [c.chunk_index for c in chunks] == list(range(expected_chunks))
    assert all(len(c.data) <= chunk_bytes for c in chunks)
    assert assemble_weights(chunks) == BLOB


def test_empty_blob_is_one_empty_chunk():
    (chunk,) = chunk_weights("tiny", 0, b"", 16)
    assert chunk.data == b"" and chunk.num_chunks == 1 and chunk.total_bytes == 0
    assert assemble_weights([chunk]) == b""


def test_any_order_and_redelivered_duplicates():
    chunks = chunk_weights("tiny", 7, BLOB, 100)
    shuffled = chunks + chunks[3:5]  # at-least-once: some arrive twice
    random.Random(0).shuffle(shuffled)
    assert shuffled[:11] != chunks
    assert assemble_weights(shuffled) == BLOB


def test_chunks_survive_the_codec():
    chunks = [decode(encode(c), expect=WeightUpdate) for c in chunk_weights("tiny", 7, BLOB, 300)]
    assert assemble_weights(chunks) == BLOB


def test_missing_chunk():
    chunks = chunk_weights("tiny", 7, BLOB, 100)
    with pytest.raises(WeightIntegrityError, match=r"tiny v7: missing 1 of 11 chunks: 4"):
        assemble_weights(chunks[:4] + chunks[5:])


def test_no_chunks():
    with pytest.raises(WeightIntegrityError, match="no chunks"):
        assemble_weights([])


def test_corrupted_chunk_fails_the_checksum():
    chunks = chunk_weights("tiny", 7, BLOB, 100)
    chunks[2] = chunks[2].model_copy(update={"data": bytes(100)})  # same size, wrong bytes
    with pytest.raises(WeightIntegrityError, match="sha256"):
        assemble_weights(chunks)


def test_duplicate_with_different_bytes():
    chunks = chunk_weights("tiny", 7, BLOB, 100)
    other = chunks[0].model_copy(update={"data": bytes(100)})
    with pytest.raises(WeightIntegrityError, match="chunk 0 delivered twice with different bytes"):
        assemble_weights([*chunks, other])


def test_mixed_versions():
    v7 = chunk_weights("tiny", 7, BLOB, 100)
    v8 = chunk_weights("tiny", 8, BLOB, 100)
    with pytest.raises(WeightIntegrityError, match="v8 does not belong with tiny v7"):
        assemble_weights(v7[:5] + v8[5:])


def test_total_size_mismatch():
    chunks = [c.model_copy(update={"total_bytes": 2000}) for c in chunk_weights("tiny", 7, BLOB, 100)]
    with pytest.raises(WeightIntegrityError, match="1028 bytes, expected total_bytes 2000"):
        assemble_weights(chunks)


BUCKETS = [Bucket(file="bucket-0000.safetensors", bytes=1000, sha256=SHA,
                  tensors=(TensorMeta(name="w", dtype="F32", shape=(250,)),)),
           Bucket(file="bucket-0001.safetensors", bytes=28, sha256="1" * 64, tensors=())]


def test_files_announcement_fingerprints_its_manifest():
    update = announce_buckets("big", 3, BUCKETS, transport="files", uri="s3://bucket/big/v00000003")
    assert update.data is None and update.total_bytes == 1028 and update.sha256 == manifest_digest(BUCKETS)
    assert decode(encode(update)) == update
    assert from_arrow(to_arrow([update]), WeightUpdate) == [update]  # the manifest as JSON text
    verify_manifest(update)
    forged = update.model_copy(update={"manifest": (BUCKETS[0].model_copy(update={"sha256": "2" * 64}), BUCKETS[1])})
    with pytest.raises(WeightIntegrityError, match="manifest does not match") as e:
        verify_manifest(forged)
    assert e.value.reason == "manifest"
    with pytest.raises(WeightIntegrityError, match="travels by files"):
        assemble_weights([update])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"transport": "broadcast", "rendezvous": "no-port"}, "rendezvous"),
        ({"data": b"x"}, "inline data or a manifest, not both"),
        ({"transport": ""}, "transport"),
        ({"total_bytes": 5}, "sum of the manifest"),
        ({"manifest": (BUCKETS[0], BUCKETS[0])}, "total_bytes is not the sum|bucket file twice"),
        ({"num_chunks": 2}, "has no chunks"),
    ],
)
def test_invalid_announcement(fields, message):
    base = dict(model="m", version=1, transport="files", total_bytes=1028, sha256=manifest_digest(BUCKETS),
                manifest=tuple(BUCKETS), uri="file:///w")
    with pytest.raises(ValidationError, match=message):
        WeightUpdate(**{**base, **fields})


BASE = dict(model="m", version=1, total_bytes=3, sha256="0" * 64)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_chunks": 2}, "without inline data has no chunks"),
        ({"data": b"a", "chunk_index": 2, "num_chunks": 2}, "chunk_index 2 >= num_chunks 2"),
        ({"data": b"abcd"}, "4 bytes > total_bytes 3"),
        ({"data": b"a", "sha256": "A" * 64}, "sha256"),
        ({"data": b"a", "format": "pickle"}, "format"),
    ],
)
def test_invalid_weight_update(fields, message):
    """Only what holds for every transport: which fields one needs, it checks on receipt (tests/streams)."""
    with pytest.raises(ValidationError, match=message):
        WeightUpdate(**{**BASE, **fields})


def test_chunk_bytes_must_be_positive():
    with pytest.raises(ValueError, match="chunk_bytes"):
        chunk_weights("tiny", 1, BLOB, 0)
