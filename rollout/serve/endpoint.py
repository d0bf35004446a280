"""What the HTTP endpoint runs on: the worker's engine and weights, the sessions, and the publishing.

Requests asked at once share engine calls (`Batcher`: one thread owns the engine, so a generation
and a weight load never overlap), and before each call the newest verified weights the subscriber
brought in are loaded, as the rollout worker does between generations. Every turn records the
policy version that generated it. When an agent program reports a session's reward, its
trajectory is published on `<ns>.experiences.raw` as one Experience, keyed by group id, with the
worker's metadata; a session idle past `serve.session_ttl_s` is dropped unpublished instead.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from typing import Annotated, Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from undertow.kernel.models import fingerprint
from undertow.schemas import MAX_RECORD_BYTES, Experience, MetricEvent, Task, encode
from undertow.streams import RecordProducer, RunContext, Topics

from undertow.rollout.config import RolloutConfig
from undertow.rollout.engines import Engine, Sample, SamplingParams, build_engine
from undertow.rollout.experiences import experience_id, to_experiences
from undertow.rollout.rewards.registry import total
from undertow.rollout.serve.batcher import Answer, Batcher
from undertow.rollout.serve.config import ServeConfig
from undertow.rollout.serve.protocol import ApiError, ChatRequest, completion, invalid
from undertow.rollout.serve.sessions import Generated, Session, SessionMismatch, render, tokenize
from undertow.rollout.serve.tool_calls import ParsedOutput, split_tool_calls
from undertow.rollout.weight_subscriber import WeightSubscriber

log = logging.getLogger(__name__)

# Request headers that make a request one turn of a recorded session (read at its first turn).
SESSION, GROUP, GROUP_SIZE, SAMPLE, TASKSET = ("x-undertow-session", "x-undertow-group", "x-undertow-group-size",
                                               "x-undertow-sample", "x-undertow-taskset")
SESSION_ID = re.compile(r"^[A-Za-z0-9_.:@-]{1,200}$")
EXPIRED_REMEMBERED = 10_000  # ids of sessions dropped for idleness kept to say so (then they are plain unknown)


class RewardBody(BaseModel):
    """The body of `POST /v1/undertow/sessions/{id}/reward`: a reward, or its named components."""

    model_config = ConfigDict(extra="forbid")

    reward: float | None = Field(None, allow_inf_nan=False, description="the episode's reward")
    components: dict[str, Annotated[float, Field(allow_inf_nan=False)]] | None = Field(
        None, description="named parts; the reward is their sum")


class Endpoint:
    """The rollout worker's engine and weight subscriber behind OpenAI's chat completions.

    `Endpoint.connect(cfg, run)` builds it as `undertow serve` runs it; without `producer` (tests)
    it answers completions and records sessions but has nowhere to publish them."""

    def __init__(self, engine: Engine, model_name: str, sampling: SamplingParams, *, name: str = "serve-0",
                 producer: RecordProducer | None = None, topics: Topics | None = None,
                 subscriber: WeightSubscriber | None = None, settings: ServeConfig | None = None):
        self.engine, self.model_name, self.sampling, self.name = engine, model_name, sampling, name
        self.tokenizer = engine.tokenizer
        self.fingerprint = fingerprint(self.tokenizer)
        self.producer, self.topics, self.subscriber = producer, topics, subscriber
        self.version = 0
        self.weight_swaps = 0
        self.published = 0
        self.expired = 0
        self._expired_ids: OrderedDict[str, None] = OrderedDict()
        self._stop = threading.Event()
        self.settings = settings or ServeConfig()
        self.batcher = Batcher(engine, before=self._swap_weights, window_s=self.settings.batch_window_s,
                               max_batch=self.settings.max_batch)
        self._sessions: dict[str, Session] = {}
        self._session_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()  # guards the two dicts

    @classmethod
    def connect(cls, cfg: RolloutConfig, run: RunContext, name: str = "serve-0",
                settings: ServeConfig | None = None) -> "Endpoint":
        """The engine of `cfg` (rollout.engine, rollout.sampling), the worker's producer and weights subscriber."""
        engine = build_engine(cfg.engine, run.model)
        producer = RecordProducer(run.kafka)
        subscriber = WeightSubscriber(run.kafka, run.topics, run.model.name, producer,
                                      tokenizer=fingerprint(engine.tokenizer))
        return cls(engine, run.model.name, cfg.sampling, name=name, producer=producer, topics=run.topics,
                   subscriber=subscriber, settings=settings)

    def start(self, wait_s: float = 120.0) -> None:
        """Follow the weights topic; generate from the newest published weights, as a fresh worker does.
        Sweep idle sessions meanwhile (requests sweep too; this catches them when none come)."""
        if self.settings.session_ttl_s is not None:
            threading.Thread(target=self._sweep, name=f"{self.name}-sessions", daemon=True).start()
        if self.subscriber is None:
            return
        self.subscriber.start()
        if not self.subscriber.caught_up.wait(timeout=wait_s):
            log.warning("%s: weights topic not read to its end after %.0f s; serving anyway", self.name, wait_s)

    def close(self) -> None:
        self._stop.set()
        self.batcher.close()
        if self.subscriber is not None:
            self.subscriber.stop()
        if self.producer is not None:
            self.producer.flush()
            self.producer.close()

    # -- requests ------------------------------------------------------------------------------

    def chat(self, body: Any, headers: Mapping[str, str]) -> dict[str, Any]:
        """`POST /v1/chat/completions`: a completion; with a session header, one recorded turn."""
        try:
            request = ChatRequest.model_validate(body)
        except ValidationError as e:
            raise invalid(e) from None
        request.refuse_unsupported()
        if request.model != self.model_name:
            raise ApiError(404, f"The model `{request.model}` does not exist", param="model", code="model_not_found")
        session_id = headers.get(SESSION)
        self.expire_idle()
        if session_id is None:
            return self._answer(request)
        if not SESSION_ID.match(session_id):
            raise ApiError(400, f"{SESSION} must match {SESSION_ID.pattern}", param=SESSION)
        session, lock = self._session(session_id, headers)
        with lock:  # one turn of a session at a time: the next one extends this one's tokens
            with self._lock:  # a first turn of the same id that held the lock before us made it
                if session_id in self._expired_ids:  # dropped while we waited for its lock
                    raise self._unknown(session_id)
                session = self._sessions.get(session_id, session)
            return self._turn(session, request)

    def reward(self, session_id: str, body: Any) -> dict[str, Any]:
        """Publish session `session_id` with its reward, then close it."""
        try:
            reward = RewardBody.model_validate(body)
        except ValidationError as e:
            raise invalid(e) from None
        if (reward.reward is None) == (reward.components is None):
            raise ApiError(400, "give exactly one of `reward` and `components`", param="reward")
        components = reward.components if reward.components is not None else {"reward": reward.reward}
        self.expire_idle()
        session, lock = self._known(session_id)
        if self.producer is None:
            raise ApiError(503, "this endpoint has no broker to publish to", type="server_error")
        with lock:
            if self._sessions.get(session_id) is not session:  # published by a request that held the lock first
                raise self._unknown(session_id)
            exp = self._experience(session, components)
            published = self._publish(exp)
            self._forget(session_id)
        return {"session": session_id, "experience_id": exp.experience_id, "published": published, "reward": exp.reward,
                "tokens": exp.num_response_tokens, "policy_version": exp.policy_version}

    def drop(self, session_id: str) -> dict[str, Any]:
        """Close a session without publishing it (an episode the agent program abandoned)."""
        self.expire_idle()
        _, lock = self._known(session_id)
        with lock:
            self._forget(session_id)
        return {"session": session_id, "deleted": True}

    @property
    def sessions_open(self) -> int:
        return len(self._sessions)

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [self.model_card()]}

    def model_card(self, model: str | None = None) -> dict[str, Any]:
        if model is not None and model != self.model_name:
            raise ApiError(404, f"The model `{model}` does not exist", param="model", code="model_not_found")
        return {"id": self.model_name, "object": "model", "created": 0, "owned_by": "undertow",
                "policy_version": self.version}

    # -- turns ---------------------------------------------------------------------------------

    def _answer(self, request: ChatRequest) -> dict[str, Any]:
        """An unrecorded completion: any temperature (0: greedy), `n` choices."""
        try:
            prompt = tokenize(self.tokenizer, render(self.tokenizer, request.template_messages(),
                                                     request.rendered_tools()))
        except ValueError as e:
            raise ApiError(400, str(e), param="messages") from None
        temperature = request.temperature if request.temperature is not None else self.sampling.temperature
        params = self.sampling.model_copy(update={
            "greedy": temperature == 0, "temperature": temperature or self.sampling.temperature,
            "top_p": request.top_p or self.sampling.top_p})
        turn = self._generate(prompt, request.n, params, request)
        return self._response(request, prompt, turn.samples)

    def _turn(self, session: Session, request: ChatRequest) -> dict[str, Any]:
        """One recorded turn, sampled as rollout.sampling says: the trainer recomputes log-probs at that
        temperature, so another one would bias its importance ratios."""
        for name, value in (("temperature", request.temperature), ("top_p", request.top_p)):
            if value is not None and value != getattr(self.sampling, name):
                raise ApiError(400, f"a recorded session samples with rollout.sampling.{name} = "
                               f"{getattr(self.sampling, name)}; {name} = {value} is not allowed", param=name)
        if request.n != 1:
            raise ApiError(400, "a recorded session takes one choice per turn (n = 1)", param="n")
        try:
            pending = session.next_prompt(self.tokenizer, request.template_messages(), request.rendered_tools())
        except SessionMismatch as e:
            raise ApiError(400, str(e), param="messages", code="session_history_mismatch") from None
        except ValueError as e:
            raise ApiError(400, str(e), param="messages") from None
        turn = self._generate(pending.prompt, 1, self.sampling, request)
        sample = turn.samples[0]
        session.record(pending, Generated(tokens=sample.tokens, logprobs=sample.logprobs,
                                          finish_reason=sample.finish_reason, version=turn.version), self.tokenizer)
        session.touched = time.monotonic()
        with self._lock:
            self._sessions.setdefault(session.session_id, session)
        return self._response(request, pending.prompt, [sample])

    def _generate(self, prompt: list[int], n: int, params: SamplingParams, request: ChatRequest) -> Answer:
        limit = getattr(self.engine, "max_length", None)
        wanted = request.max_completion_tokens or request.max_tokens or params.max_new_tokens
        room = wanted if limit is None else min(wanted, limit - len(prompt))
        if room < 1:
            raise ApiError(400, f"This model's maximum context length is {limit} tokens; the messages take "
                           f"{len(prompt)}", param="messages", code="context_length_exceeded")
        params = params.model_copy(update={"max_new_tokens": room})
        check = getattr(type(self.engine), "check_sampling", None)
        if check is not None:
            try:
                check(params)
            except ValueError as e:
                raise ApiError(400, str(e)) from None  # vLLM refuses top_p < 1 (its log-probs are the nucleus')
        return self.batcher.generate(prompt, n, params)

    def _response(self, request: ChatRequest, prompt: list[int], samples: list[Sample]) -> dict[str, Any]:
        tools = request.rendered_tools() is not None  # none offered: the text is the answer, tags and all
        choices = [(split_tool_calls(s.text) if tools else ParsedOutput(s.text, []), s.finish_reason) for s in samples]
        return completion(self.model_name, choices, len(prompt), sum(len(s.tokens) for s in samples))

    def _swap_weights(self) -> int:
        """Between generations (on the batcher's thread): the newest verified version, if one arrived;
        the version the next generation uses."""
        if self.subscriber is None:
            return self.version
        swapped = self.subscriber.swap_in(self.engine, self.version)
        if swapped is None:
            return self.version
        self.version, paused = swapped
        self.weight_swaps += 1
        self.producer.send(self.topics.metrics, MetricEvent(component=self.name, step=self.version,
                                                            values={"weight_swap_s": paused}), key=self.name)
        log.info("%s: now serving %s v%d (swap %.3f s)", self.name, self.model_name, self.version, paused)
        return self.version

    # -- sessions and publishing ---------------------------------------------------------------

    def _session(self, session_id: str, headers: Mapping[str, str]) -> tuple[Session, threading.Lock]:
        """The session of this id, or a new one placed in its group by the headers (kept once it has a turn)."""
        with self._lock:
            if session_id in self._expired_ids:  # its next turn would start a new episode mid-conversation
                raise self._unknown(session_id)
            if session_id not in self._sessions and len(self._sessions) >= self.settings.max_sessions:
                raise ApiError(429, f"{len(self._sessions)} sessions are open (serve.max_sessions): report the reward "
                               f"of (or DELETE) finished sessions before starting new ones", type="rate_limit_error",
                               code="too_many_sessions")
            lock = self._session_locks.setdefault(session_id, threading.Lock())
            if session_id in self._sessions:
                return self._sessions[session_id], lock
        try:
            size, index = int(headers.get(GROUP_SIZE, "1")), int(headers.get(SAMPLE, "0"))
        except ValueError:
            raise ApiError(400, f"{GROUP_SIZE} and {SAMPLE} must be integers", param=GROUP_SIZE) from None
        if not 0 <= index < size:
            raise ApiError(400, f"{SAMPLE} must be in [0, {GROUP_SIZE})", param=SAMPLE)
        group, taskset = headers.get(GROUP, session_id), headers.get(TASKSET, "serve")
        if not (SESSION_ID.match(taskset) and 0 < len(group) <= 200):
            raise ApiError(400, f"{GROUP} (1-200 characters) or {TASKSET} ({SESSION_ID.pattern}) is invalid",
                           param=GROUP)
        return Session(session_id, group_id=group, group_size=size, sample_index=index, taskset=taskset), lock

    def _known(self, session_id: str) -> tuple[Session, threading.Lock]:
        with self._lock:
            if session_id not in self._sessions:
                raise self._unknown(session_id)
            return self._sessions[session_id], self._session_locks[session_id]

    def _unknown(self, session_id: str) -> ApiError:
        if session_id in self._expired_ids:
            return ApiError(404, f"Session `{session_id}` expired: no request for serve.session_ttl_s = "
                            f"{self.settings.session_ttl_s:g} s; it was dropped unpublished", param="session",
                            code="session_expired")
        return ApiError(404, f"No session `{session_id}` (never started, or already published)",
                        param="session", code="session_not_found")

    def expire_idle(self, now: float | None = None) -> list[str]:
        """Drop, unpublished, every session with no request for `serve.session_ttl_s` (one whose turn
        is running is not idle); count them in the `sessions_expired` metric. Returns their ids."""
        ttl = self.settings.session_ttl_s
        now = time.monotonic() if now is None else now
        dropped = []
        with self._lock:
            for session_id, session in list(self._sessions.items()) if ttl is not None else []:
                lock = self._session_locks[session_id]
                if now - session.touched < ttl or not lock.acquire(blocking=False):
                    continue
                del self._sessions[session_id], self._session_locks[session_id]
                lock.release()
                self._expired_ids[session_id] = None
                dropped.append(session)
            while len(self._expired_ids) > EXPIRED_REMEMBERED:
                self._expired_ids.popitem(last=False)
            self.expired += len(dropped)
        for session in dropped:
            log.warning("%s: session %s expired after %.0f s idle (%d turn(s), %d tokens dropped unpublished)",
                        self.name, session.session_id, now - session.touched, len(session.turns), len(session.tokens))
        if dropped and self.producer is not None:
            self.producer.send(self.topics.metrics, MetricEvent(component=self.name, step=self.version, values={
                "sessions_expired": float(len(dropped)), "sessions_expired_total": float(self.expired)}), key=self.name)
        return [s.session_id for s in dropped]

    def _sweep(self) -> None:
        while not self._stop.wait(min(self.settings.session_ttl_s / 2, 10.0)):
            self.expire_idle()

    def _forget(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)
            self._session_locks.pop(session_id, None)

    def _experience(self, session: Session, components: dict[str, float]) -> Experience:
        """The session as the worker would publish it: `to_experiences`' fields and metadata, placed in its group."""
        task = Task(task_id=session.group_id, prompt=session.prompt_text or " ", taskset=session.taskset,
                    created_at=session.started)
        (exp,) = to_experiences(task, [session.trajectory(components)], policy_version=session.policy_version,
                                worker=self.name, tokenizer=self.fingerprint)
        return Experience.model_validate({**exp.model_dump(), "group_size": session.group_size,
                                          "sample_index": session.sample_index,
                                          "experience_id": experience_id(session.group_id, session.sample_index)})

    def _publish(self, exp: Experience) -> bool:
        """Send and wait for the acknowledgement (a failure raises and leaves the session open for a
        retry); one larger than any reader accepts goes to the rejected topic instead (False)."""
        data = encode(exp)
        if len(data) > MAX_RECORD_BYTES:
            self.producer.reject(self.topics.rejected, stage="rollout", reason="too_large",
                                 detail=f"{len(data)} bytes > max_bytes {MAX_RECORD_BYTES}", original=data,
                                 key=exp.group_id.encode(), record_id=exp.experience_id)
            self.producer.flush()
            return False
        self.producer.send_bytes(self.topics.raw, data, key=exp.group_id)
        self.producer.send(self.topics.metrics, MetricEvent(component=self.name, step=exp.policy_version, values={
            "reward_mean": total(exp.reward_components), "turns": float(exp.metadata["turns"]),
            "episode_tokens": float(exp.num_response_tokens), "policy_version": float(exp.policy_version)}),
            key=self.name)
        self.producer.flush()
        self.published += 1
        return True
