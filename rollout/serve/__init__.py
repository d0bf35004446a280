"""The OpenAI-compatible endpoint: `undertow serve CONFIG` (`/v1/chat/completions`, `/v1/models`),
recorded sessions published as experiences when the agent reports their reward."""

from undertow.rollout.serve.client import Episode
from undertow.rollout.serve.tool_calls import split_tool_calls

__all__ = ["Episode", "split_tool_calls"]
