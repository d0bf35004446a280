"""A tiny client for agent programs: the headers that make requests one session, and the reward call.

```python
from openai import OpenAI
from undertow.rollout.serve.client import Episode

episode = Episode("http://127.0.0.1:8000/v1", group="task-17", group_size=4, sample=2)
client = OpenAI(base_url=episode.base_url, api_key="-", default_headers=episode.headers)
...                                   # the agent program, unchanged
episode.report(reward=1.0)            # publishes the trajectory on <ns>.experiences.raw
```

Standard library only (urllib): an agent's environment needs nothing of undertow's dependencies.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from typing import Any


class Episode:
    """One recorded session: `headers` for every request of the episode, `report()` at its end."""

    def __init__(self, base_url: str, session: str | None = None, *, group: str | None = None, group_size: int = 1,
                 sample: int = 0, taskset: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.session = session or uuid.uuid4().hex
        self.headers = {"X-Undertow-Session": self.session, "X-Undertow-Group-Size": str(group_size),
                        "X-Undertow-Sample": str(sample)}
        if group is not None:
            self.headers["X-Undertow-Group"] = group
        if taskset is not None:
            self.headers["X-Undertow-Taskset"] = taskset

    def report(self, reward: float | None = None, components: dict[str, float] | None = None,
               timeout: float = 30.0) -> dict[str, Any]:
        """Publish the episode with its reward (or named components); the server's answer as a dict.
        Raises RuntimeError with the server's message on an error status."""
        body = {"reward": reward} if components is None else {"components": components}
        return self._call("POST", f"/undertow/sessions/{self.session}/reward", body, timeout)

    def drop(self, timeout: float = 30.0) -> dict[str, Any]:
        """Close the session without publishing it."""
        return self._call("DELETE", f"/undertow/sessions/{self.session}", None, timeout)

    def _call(self, method: str, path: str, body: Any, timeout: float) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")
            raise RuntimeError(f"{method} {path}: HTTP {e.code}: {detail}") from None
