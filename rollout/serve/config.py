"""`serve:` — how `undertow serve` batches requests and how long it keeps an idle session."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from undertow.rollout.serve.keys import ApiKeys


class ServeConfig(BaseModel):
    """`serve:` — the OpenAI-compatible endpoint's settings (the engine and sampling are `rollout:`'s)."""

    model_config = ConfigDict(extra="forbid")

    batch_window_s: float = Field(
        0.0, ge=0, le=10, description="after a request finds the engine idle, seconds to wait for more to join its "
                                      "engine call (0: only those that arrived while the engine was busy)")
    max_batch: int = Field(64, ge=1, le=4096, description="most requests answered by one engine call")
    session_ttl_s: float | None = Field(
        600.0, gt=0, description="a recorded session with no request for this long is dropped unpublished (counted "
                                 "in the sessions_expired metric); null: kept until its reward or DELETE")
    max_sessions: int = Field(
        4096, ge=1, description="recorded sessions open at once; a new one beyond it is answered 429 (finish, "
                                "report or DELETE sessions first) instead of growing the endpoint's memory")
    api_keys: ApiKeys | None = Field(
        None, description="where the API keys are ({env: VARIABLE} or {file: PATH}, never the keys themselves): "
                          "requests then need `Authorization: Bearer KEY`; required to bind beyond loopback")
