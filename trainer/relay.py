"""Rank 0 reads Kafka; every step it tells all ranks what to do. Sent as msgpack bytes, no pickle."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgpack
import torch

from undertow.schemas import Record, decode, encode


@dataclass
class Command:
    """One step of the job: train on `records` (each rank its shard), then publish / checkpoint / stop."""

    records: list[Record] = field(default_factory=list)
    publish: bool = False
    checkpoint: bool = False
    stop: bool = False

    def to_bytes(self) -> bytes:
        return msgpack.packb({"records": [encode(r) for r in self.records], "publish": self.publish,
                              "checkpoint": self.checkpoint, "stop": self.stop}, use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: bytes) -> "Command":
        obj = msgpack.unpackb(data, raw=False)
        return cls([decode(r) for r in obj["records"]], obj["publish"], obj["checkpoint"], obj["stop"])


def collective_device() -> torch.device:
    """Where tensors of a collective must live: NCCL takes only CUDA tensors, gloo CPU ones."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast(command: Command | None, *, leader: bool, world_size: int) -> Command:
    """Rank 0 passes its command, the others None; everyone returns rank 0's command."""
    if world_size == 1:
        return command
    import torch.distributed as dist

    device = collective_device()
    data = command.to_bytes() if leader else b""
    size = torch.tensor([len(data)], dtype=torch.long, device=device)
    dist.broadcast(size, src=0)
    buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if leader else \
        torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(buffer, src=0)
    return command if leader else Command.from_bytes(buffer.cpu().numpy().tobytes())


def shard(records: list[Record], rank: int, world_size: int) -> list[Record]:
    """This rank's share of a batch: every world_size-th record."""
    return records[rank::world_size]
