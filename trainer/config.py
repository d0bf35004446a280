"""The `trainer:` section of a run config (the whole file's model is infra/run/config.py's RunConfig)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from undertow.kernel.registry import checked_entry, entry_name
from undertow.schemas import Experience
from undertow.streams.weights import WeightsConfig

from .algorithms import advantage_transforms, aggregations, kl_estimators, policy_losses, preference_losses
from .objectives import objectives
from .replay import replay_samplers

Entry = str | dict[str, Any]  # a registry entry: `name` or {name: …, **kwargs}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScheduleConfig(_Section):
    """The learning rate over optimizer steps (transformers' schedulers)."""

    name: Literal["constant", "linear", "cosine"] = Field("constant", description="shape after the warm-up")
    warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear warm-up from 0")
    total_steps: int | None = Field(None, ge=1, description="optimizer steps at which linear / cosine reach 0")

    @model_validator(mode="after")
    def _decay_needs_an_end(self) -> "ScheduleConfig":
        if self.name != "constant" and self.total_steps is None:
            raise ValueError(f"total_steps: the {self.name} schedule decays to 0 at total_steps; set it")
        if self.total_steps is not None and self.warmup_steps >= self.total_steps:
            raise ValueError("warmup_steps: must be below total_steps")
        return self


class EngineConfig(_Section):
    """The DeepSpeed engine: ZeRO stage, precision, optimizer."""

    zero_stage: Literal[0, 1, 2, 3] = Field(0, description="ZeRO stage: 0 none, 1 optimizer, 2 +grads, 3 +params")
    precision: Literal["fp32", "bf16"] = Field("fp32", description="training precision")
    optimizer: Literal["adamw", "cpu_adam"] = Field(
        "adamw", description="torch AdamW (no compile), or DeepSpeedCPUAdam (compiles once; pair with offload)")
    offload_optimizer: bool = Field(False, description="keep optimizer states on the CPU (ZeRO >= 1)")
    lr: float = Field(1e-4, gt=0, description="learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="Adam betas")
    grad_clip: float = Field(1.0, ge=0, description="max gradient norm (0: no clipping)")
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig, description="learning-rate schedule")
    seed: int = Field(0, description="seed of torch and of the priority sampler")
    master_port: int | None = Field(None, ge=1024, le=65535,
                                    description="rendezvous port for a single-process run (default: a free one)")
    collective_timeout_s: float = Field(
        600.0, ge=1, description="a collective between ranks (the step's command, gradients, the checkpoint barrier) "
        "waiting longer raises: the trainer exits for its supervisor to restart it from its checkpoint")

    @model_validator(mode="after")
    def _offload_needs_zero(self) -> "EngineConfig":
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("offload_optimizer: needs zero_stage >= 1")
        return self


class BatchingConfig(_Section):
    """How experiences become batches, and which ones are refused."""

    experiences: int | None = Field(8, ge=1, description="experiences per step (whole groups; None: token_budget)")
    token_budget: int | None = Field(None, ge=1, description="prompt+response tokens per step (whole groups)")
    pad_to_multiple: int = Field(8, ge=1, description="pad sequence length up to a multiple of this")
    max_staleness: int = Field(4, ge=0, description="refuse experiences more than this many steps old (0: on-policy)")
    group_timeout_s: float = Field(30.0, gt=0, description="release an incomplete prompt group after this long")
    window_groups: int = Field(64, ge=1, description="complete groups held in memory (bounded; backpressure)")
    prioritized: bool = Field(False, description="sample groups by priority from the window instead of FIFO")
    max_trained_ids: int = Field(100_000, ge=1, description="trained experience ids remembered for idempotence")
    max_wait_s: float = Field(5.0, ge=0, description="train on a partial batch once no data came for this long")

    @model_validator(mode="after")
    def _one_budget(self) -> "BatchingConfig":
        if (self.experiences is None) == (self.token_budget is None):
            raise ValueError("experiences / token_budget: set exactly one of them")
        return self


class KLConfig(_Section):
    """KL to a frozen reference model."""

    estimator: Entry = Field("k3", description="k1, k2, k3 (= low_var_kl), k1+ / k3+ (straight-through: k2's "
                                               "gradient), or a dotted path")
    coef: float = Field(0.0, ge=0, description="β; 0 disables the KL term and the reference model")
    placement: Literal["loss", "reward"] = Field(
        "loss", description="add β·KL to the loss, or subtract it from the advantages (with an advantage_transform: "
                            "KL(π_behaviour ‖ π_ref) folded into the token rewards once per step, before the transform)")
    bias_correction: bool = Field(False, description="weigh the loss's per-token KL by π_θ/π_behaviour (TRL's "
                                                     "use_bias_correction_kl); placement loss only")

    _check = field_validator("estimator")(lambda cls, v: checked_entry(kl_estimators, v))

    @model_validator(mode="after")
    def _correction_needs_a_loss_term(self) -> "KLConfig":
        if self.bias_correction and self.placement != "loss":
            raise ValueError("bias_correction: weighs the KL loss term; set placement: loss")
        return self


class RolloutCorrectionConfig(_Section):
    """Importance weights for the engine/trainer mismatch (trainer/algorithms/rollout_correction.py)."""

    level: Literal["token", "sequence"] = Field("token", description="a weight per token, or the answer's product")
    threshold: float = Field(2.0, gt=0, description="C: TIS caps the weight at it (verl's rollout_is_threshold)")
    lower: float | None = Field(None, gt=0, description="with it, MIS: a weight outside [lower, threshold] drops "
                                                        "its token (answer) instead (verl's 'lower_upper')")

    @model_validator(mode="after")
    def _a_band(self) -> "RolloutCorrectionConfig":
        if self.lower is not None and self.lower > self.threshold:
            raise ValueError(f"lower: {self.lower} is above threshold {self.threshold}")
        return self


class KTOConfig(_Section):
    """KTO (objective `kto`): chosen answers desirable, rejected ones undesirable, around z0 (trainer/algorithms/kto.py)."""

    beta: float = Field(0.1, gt=0, description="β: the scale of the log-ratio reward inside σ")
    desirable_weight: float = Field(1.0, gt=0, description="λ_D: the weight of desirable (chosen) examples")
    undesirable_weight: float = Field(1.0, gt=0, description="λ_U: the weight of undesirable (rejected) examples")
    kl_chunk: int = Field(16, ge=1, description="mismatched sequences per no-grad forward of z0's estimate (memory; "
                                                "a count, not the micro-batch's, so that every rank runs as many)")


class SimPOConfig(_Section):
    """SimPO (objective `simpo`): a length-normalised, reference-free margin (trainer/algorithms/simpo.py)."""

    beta: float = Field(2.0, gt=0, description="β: the scale of the mean log-prob reward (the paper uses 2.0-2.5)")
    gamma: float = Field(1.0, ge=0, description="γ: the target reward margin (the paper's γ/β is about 0.5)")


class ORPOConfig(_Section):
    """ORPO (objective `orpo`): the chosen answers' NLL plus λ times the odds-ratio loss (trainer/algorithms/orpo.py)."""

    odds_ratio_weight: float = Field(0.1, ge=0, description="λ: the weight of the odds-ratio term (TRL's beta)")


class AlgorithmConfig(_Section):
    """What is optimised."""

    objective: str = Field("rl", description="a registered objective (trainer/objectives/): rl and sft on "
                                             "experiences; dpo, kto, simpo, orpo on preference pairs; or a dotted path")
    policy_loss: Entry = Field("ppo_clip", description="ppo_clip, dapo, gspo, gmpo, cispo, sapo, clip_cov, kl_cov, "
                                                       "dppo_tv, dppo_kl, reinforce, truncated_is, decoupled_ppo, dro, vespo, opmd")
    aggregation: Entry = Field("token_mean", description="token_mean, token_sum, seq_mean_token_sum, seq_mean_token_mean, seq_mean_token_sum_norm")
    advantage_transform: Entry | None = Field(
        None, description="applied once per step over the whole batch before it is cut up: batch_whiten, "
                          "reinforce_pp, gae, gpg, or a dotted path (None: the processors' advantages as they are)")
    kl: KLConfig = Field(default_factory=KLConfig, description="KL to the reference model")
    rollout_correction: RolloutCorrectionConfig | None = Field(
        None, description="weigh each token by π_old/π_rollout (the trainer's log-probs over the engine's), TIS or "
                          "MIS, with π_old as the loss's sampling policy (verl's decoupled rollout_is); null: off")
    entropy_coef: float = Field(0.0, description="entropy bonus weight (loss −= coef · entropy)")
    dpo_beta: float = Field(0.1, gt=0, description="DPO's β")
    preference_loss: Entry = Field("sigmoid", description="dpo's loss of the pair margin: sigmoid (DPO), robust "
                                                          "(label smoothing), hinge (SLiC), ipo, sigmoid_norm (the "
                                                          "margin of per-token log-ratios); or a dotted path")
    dpo_sft_weight: float = Field(0.0, ge=0, description="α of DPO + SFT (RPO; TRL's loss_type [sigmoid, sft]): "
                                                          "α times the chosen answers' token-mean NLL is added")
    kto: KTOConfig = Field(default_factory=KTOConfig, description="objective kto's β and λ_D, λ_U")
    simpo: SimPOConfig = Field(default_factory=SimPOConfig, description="objective simpo's β and γ")
    orpo: ORPOConfig = Field(default_factory=ORPOConfig, description="objective orpo's λ")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of the rollout engine (log-probs use it)")

    _check_objective = field_validator("objective")(lambda cls, v: checked_entry(objectives, v))
    _check_loss = field_validator("policy_loss")(lambda cls, v: checked_entry(policy_losses, v))
    _check_agg = field_validator("aggregation")(lambda cls, v: checked_entry(aggregations, v))
    _check_transform = field_validator("advantage_transform")(
        lambda cls, v: v if v is None else checked_entry(advantage_transforms, v))
    _check_pref = field_validator("preference_loss")(lambda cls, v: checked_entry(preference_losses, v))


class MixingConfig(_Section):
    """CHORD (Zhang et al. 2025): expert demonstrations from `<namespace>.experiences.expert` mixed into
    every RL step, L = (1 − μ) L_RL + μ L_SFT, μ warmed up to its peak then cosine-decayed to its valley."""

    expert_per_step: int = Field(ge=1, description="expert experiences added to each step (when the topic has them)")
    mu_peak: float = Field(0.1, ge=0, le=1, description="μ at the end of the warm-up")
    mu_valley: float = Field(0.1, ge=0, le=1, description="μ after the decay")
    mu_warmup_steps: int = Field(0, ge=0, description="steps of linear rise of μ from 0 to mu_peak")
    mu_decay_steps: int = Field(0, ge=0, description="steps of cosine decay from mu_peak to mu_valley (0: none)")
    phi: bool = Field(True, description="CHORD-φ: weigh each expert token's −log p by φ = p(1 − p), detached")


class CriticConfig(_Section):
    """PPO's critic (trainer/critic.py): the policy's architecture with a scalar value head, a separate
    model trained by a DeepSpeed engine of its own (the policy's engine settings, its own learning rate
    and optimizer state), checkpointed with the policy, never published."""

    lr: float = Field(1e-4, gt=0, description="the critic's learning rate (its own AdamW)")
    value_clip: float | None = Field(0.2, gt=0, description="ε_v: the value loss's clip around the step's "
                                                            "old values (PPO2's; None: the plain squared error)")
    vf_coef: float = Field(1.0, gt=0, description="weight of the value loss; with its own Adam optimizer it "
                                                  "only matters against engine.grad_clip")
    init_from: str | None = Field(None, description="trunk weights: an HF export directory or .safetensors of "
                                                    "the policy's architecture (default: the policy's initial weights)")


class ReplayConfig(_Section):
    """Replay that reuses (trainer/replay.py): each step takes ⌊ratio · N⌋ of its N records (or tokens)
    from groups trained before, whole groups, and the rest fresh from the ready topic."""

    ratio: float = Field(0.25, gt=0, lt=1, description="share of each step's records (tokens with token_budget) "
                                                        "drawn from the buffer; the rest is fresh")
    sampler: Entry = Field("uniform", description="which trained groups are drawn: uniform, priority ({name: "
                                                  "priority, alpha: 0.6}), age_decay ({name: age_decay, "
                                                  "half_life: 4}), or a dotted path")
    max_uses: int = Field(2, ge=2, description="times a record is trained in all, its first (fresh) training "
                                               "included; then its group leaves the buffer")
    capacity_groups: int = Field(256, ge=1, description="trained groups kept for reuse, the oldest leave first "
                                                        "(a checkpoint keeps their offsets, not their bytes)")

    _check = field_validator("sampler")(lambda cls, v: checked_entry(replay_samplers, v))


class LoraConfig(_Section):
    """LoRA adapters (peft): only they train; the KL reference is the base with adapters off."""

    rank: int = Field(8, ge=1, description="r, the rank of each adapter")
    alpha: float = Field(16.0, gt=0, description="α: the update is α/r · B A")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input")
    targets: list[str] | None = Field(None, min_length=1,
                                      description="module names to adapt (None: peft's default for the architecture)")


class TrainerConfig(_Section):
    """The `trainer:` section."""

    engine: EngineConfig = Field(default_factory=EngineConfig, description="DeepSpeed engine")
    batching: BatchingConfig = Field(default_factory=BatchingConfig, description="batching and admission")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="losses")
    micro_batch_tokens: int | None = Field(
        None, ge=1, description="padded tokens per forward/backward pass; gradients accumulate (None: one pass)")
    mini_batches: int = Field(1, ge=1, description="optimizer updates per epoch over a step's batch")
    ppo_epochs: int = Field(1, ge=1, description="passes over a step's batch (proximal policy: the step's start)")
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward (less memory)")
    lora: LoraConfig | None = Field(None, description="train LoRA adapters only and publish adapter-only updates")
    mixing: MixingConfig | None = Field(None, description="mix expert demonstrations into RL steps (CHORD)")
    critic: CriticConfig | None = Field(None, description="a value model for the advantage_transform gae (PPO "
                                                          "with a critic); None: critic-free")
    replay: ReplayConfig | None = Field(None, description="reuse trained groups in later steps, importance-"
                                                          "corrected (None: every record is trained once)")
    sync_every: int = Field(1, ge=1, description="publish weights every this many steps (and at the end)")
    weights: WeightsConfig = Field(default_factory=WeightsConfig, description="how weights reach the workers")
    checkpoint_dir: str = Field("~/.undertow/trainer", description="checkpoints go to <checkpoint_dir>/<namespace>")
    checkpoint_every: int = Field(50, ge=1, description="checkpoint every this many steps (and on shutdown)")
    idle_checkpoint_s: float | None = Field(
        60.0, gt=0, description="a trainer that ran no step this long while records were handled since its last "
                                "checkpoint (rejected as stale, say, or trained by steps short of checkpoint_every) "
                                "checkpoints its step and commits, so that its group's lag shows what is left; None: never")
    keep_checkpoints: int = Field(2, ge=1, description="checkpoints kept on disk")
    consumer_group: str = Field("undertow-trainer", description="Kafka consumer group (offset commits)")
    poll_timeout_ms: int = Field(200, ge=1, description="longest wait for data per poll")

    @model_validator(mode="after")
    def _mixing_mixes_into_experiences(self) -> "TrainerConfig":
        if self.mixing is None:
            return self
        if objectives.get(self.algorithm.objective).record_type is not Experience:
            raise ValueError(f"mixing: mixes demonstrations into steps on experiences; the objective "
                             f"{self.algorithm.objective!r} trains on other records")
        if self.algorithm.advantage_transform is not None:
            raise ValueError("mixing: an advantage_transform's once-per-step pass does not yet separate the "
                             "expert records; use one or the other")
        return self

    @model_validator(mode="after")
    def _mini_batches_fit(self) -> "TrainerConfig":
        n = self.batching.experiences
        if n is not None and self.mini_batches > n:
            raise ValueError(f"mini_batches: {self.mini_batches} updates cannot split a batch of {n} experiences")
        return self

    @model_validator(mode="after")
    def _critic_and_its_reader(self) -> "TrainerConfig":
        transform = self.algorithm.advantage_transform
        reads = transform is not None and getattr(advantage_transforms.resolve(transform).obj, "needs_values", False)
        if reads and self.critic is None:
            raise ValueError(f"critic: the advantage_transform {entry_name(transform)} needs a critic's values; "
                             "set trainer.critic (e.g. {lr: 1e-5})")
        if self.critic is not None and not reads:
            raise ValueError("critic: nothing reads the critic's values; set trainer.algorithm.advantage_transform "
                             "to one that does (gae)")
        return self


    @model_validator(mode="after")
    def _replay_can_correct(self) -> "TrainerConfig":
        """A reused record comes from an older policy. An offline objective (sft, dpo, ...: no staleness
        bound) learns it again as another epoch would; an on-policy one must weigh each token by its
        importance ratio to the behaviour log-probs the record keeps (PPO's clip, truncated IS, ...)."""
        if self.replay is None:
            return self
        objective = objectives.get(self.algorithm.objective)
        if not objective.checks_staleness:
            return self
        if not getattr(objective, "importance_sampled", False):
            raise ValueError(f"replay: the objective {self.algorithm.objective!r} does not weigh by the behaviour "
                             "log-probs, so it cannot correct reused (off-policy) records; use rl or drop replay")
        loss = policy_losses.resolve(self.algorithm.policy_loss)
        if not getattr(loss.obj, "weighs_behaviour", False):
            raise ValueError(f"replay: the policy_loss {loss.name!r} has no importance ratio to the behaviour "
                             "log-probs, so it cannot correct reused (off-policy) records; use ppo_clip, "
                             "decoupled_ppo or truncated_is (or mark a loss that weighs by π_θ/π_behaviour "
                             "with `weighs_behaviour = True`)")
        return self
