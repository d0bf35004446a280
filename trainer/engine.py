"""The DeepSpeed engine around the policy: process setup, ZeRO config, optimizer, weight gathering.

On CPU it uses the gloo backend; a single process gets the rendezvous variables DeepSpeed needs
(without LOCAL_RANK it asserts, without MASTER_ADDR it looks for mpi4py). Under torchrun they are
already set, and so is the world size. On a GPU the same code uses NCCL.
"""

from __future__ import annotations

import os
import socket
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

from undertow.kernel.models import ModelSpec, build_model
from undertow.kernel.models.adapters import LoraShape, adapter_tensors, wrap_lora
from undertow.kernel.models.weights import state_tensors

from .config import EngineConfig, LoraConfig
from .optim import build_optimizer, build_schedule


@dataclass
class Process:
    """This process's place in the training job."""

    rank: int
    world_size: int
    device: torch.device

    @property
    def is_leader(self) -> bool:
        return self.rank == 0


def setup_process(master_port: int | None = None, timeout_s: float = 600.0) -> Process:
    """Environment defaults, then `deepspeed.init_distributed` (idempotent).

    A launcher (deepspeed, torchrun) sets the rendezvous variables; a single process alone picks
    `master_port` or a free port, so that two trainers on one machine never collide. A collective that
    waits `timeout_s` for a rank raises instead of hanging (a rank cut off by the network, or frozen).
    """
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "undertow" / "torch_extensions"))
    gpu = torch.cuda.is_available()
    if not gpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for name, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(master_port or free_port())), ("RANK", "0"),
                        ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(name, value)
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if gpu else "gloo", timeout=timedelta(seconds=timeout_s))
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    return Process(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), device)


def collective_failed(error: BaseException) -> bool:
    """Whether `error` came out of a torch.distributed collective (a timeout, a peer gone): the process
    group is broken, whatever the batch held. Gloo raises a plain RuntimeError, so the traceback tells."""
    if isinstance(error, dist.DistError):
        return True
    inside = f"{os.sep}torch{os.sep}distributed{os.sep}"
    return any(inside in frame.filename for frame in traceback.extract_tb(error.__traceback__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def deepspeed_config(cfg: EngineConfig, world_size: int) -> dict[str, Any]:
    """The caller owns accumulation (`managed_gradient_accumulation: false`): `backward()` only adds
    gradients up, and each `step()` reduces them over the ranks and updates, however many micro-batches
    came before it. Without ZeRO the guard clips (DeepSpeed's own clip there reports no norm)."""
    zero: dict[str, Any] = {"stage": cfg.zero_stage}
    if cfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "train_batch_size": world_size, "managed_gradient_accumulation": False,
            "gradient_clipping": cfg.grad_clip if cfg.zero_stage > 0 else 0.0,
            "bf16": {"enabled": cfg.precision == "bf16"}, "zero_optimization": zero,
            # ZeRO vets optimizers by exact type; the guarded ones are torch's / DeepSpeed's own underneath.
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 1 << 30, "wall_clock_breakdown": False}


def build_training_engine(spec: ModelSpec, cfg: EngineConfig, process: Process, *,
                 gradient_checkpointing: bool = False, lora: LoraConfig | None = None) -> Any:
    """The policy from `spec` wrapped in a DeepSpeed engine, in train mode (with LoRA: the base
    frozen, adapters on top)."""
    torch.manual_seed(cfg.seed)
    model = build_model(spec).to(process.device).train()
    if gradient_checkpointing:
        # Non-reentrant: works with inputs that need no grad (a frozen base under LoRA) and with ZeRO's hooks.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if lora is not None:
        model = wrap_lora(model, LoraShape(lora.rank, lora.alpha, lora.dropout,
                                           tuple(lora.targets) if lora.targets else None))
    return wrap_engine(model, cfg, process)


def wrap_engine(model: torch.nn.Module, cfg: EngineConfig, process: Process) -> Any:
    """`model` in a DeepSpeed engine with its own guarded optimizer and schedule (the policy's, or the
    critic's beside it)."""
    import deepspeed

    optimizer = build_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=build_schedule(cfg, optimizer),
                                      config=deepspeed_config(cfg, process.world_size))
    return engine


def build_reference(spec: ModelSpec, process: Process, engine: Any) -> Any:
    """The frozen initial policy, for KL and DPO: under LoRA the policy's own base, adapters off
    (no second copy of the weights), else a copy of the initial weights."""
    if is_lora(engine):
        return AdaptersOff(engine.module)
    model = build_model(spec).to(process.device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


class AdaptersOff:
    """Calls a peft model with its adapters disabled: the base model, sharing its weights."""

    def __init__(self, peft_model: Any):
        self.peft_model = peft_model

    def __call__(self, **inputs: Any) -> Any:
        with torch.no_grad(), self.peft_model.disable_adapter():
            return self.peft_model(**inputs)


def is_lora(engine: Any) -> bool:
    from peft import PeftModel

    return isinstance(engine.module, PeftModel)


T = TypeVar("T")


def gathered_weights(engine: Any, pack: Callable[[dict[str, torch.Tensor], dict[str, str] | None], T] | None
                     ) -> T | None:
    """What rank 0 publishes, packed by `pack(tensors, metadata)` (None elsewhere): the full weights,
    or under LoRA the adapter alone with its self-describing metadata. Every rank must call it: under
    ZeRO-3 each holds a slice of every parameter, whole only inside the gather, so `pack` must copy."""
    import deepspeed

    module = engine.module
    lora = is_lora(engine)
    gather = engine.zero_optimization_stage() == 3
    params = [p for p in module.parameters() if p.requires_grad or not lora] if gather else []
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None, enabled=gather):
        if dist.get_rank() != 0 or pack is None:
            return None
        tensors, metadata = adapter_tensors(module) if lora else (state_tensors(module), None)
        return pack(tensors, metadata)


def export_pretrained(engine: Any, directory: Path) -> None:
    """An HF `save_pretrained` copy of the current weights (rank 0 writes; every rank must call it).
    Under LoRA `directory` holds the adapters merged into the base, and `<directory>-adapter` the
    adapter alone (peft's format)."""
    import copy

    import deepspeed

    module = engine.module
    gather = engine.zero_optimization_stage() == 3
    params = list(module.parameters()) if gather else []
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None, enabled=gather):
        if dist.get_rank() != 0:
            return
        if is_lora(engine):
            module.save_pretrained(directory.with_name(directory.name + "-adapter"), safe_serialization=True)
            module = copy.deepcopy(module).merge_and_unload()  # the live model keeps its adapters
        module.save_pretrained(directory, safe_serialization=True)


def rank_fingerprints(engine: Any) -> list[str] | None:
    """The sha256 of the weights each rank holds (every rank must call it): data-parallel ranks that
    disagree have silently diverged. None for one rank (nothing to compare) and under ZeRO-3, where
    no rank holds whole weights."""
    import hashlib

    if dist.get_world_size() == 1 or engine.zero_optimization_stage() == 3:
        return None
    digest = hashlib.sha256()
    for name, tensor in sorted(engine.module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    everyone: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, digest.hexdigest())
    return everyone
