"""kafka-python checksums every record batch it sends or reads: in pure Python that took 0.1 s per
MiB, most of a weight broadcast's time (SmolLM2's 513 MiB: ~90 s)."""

from kafka.record import util


def test_kafka_python_checksums_record_batches_in_c():
    assert util.crc32c_c is not None, "the crc32c package is missing: kafka-python falls back to pure Python"
    assert util.calc_crc32c(b"123456789") == 0xE3069283  # CRC-32C's published check value
