"""The policy through a gateway, as an environment sees it: a `clawr1.environment.ChatClient` over the
official `openai` client (sessions by X-Session-Id), used by `clawr1 rollout` and `clawr1 bench`."""
from __future__ import annotations

from typing import Optional

import httpx
import openai

from clawr1.environment import AssistantTurn, assistant_turn


class GatewayChat:
    def __init__(self, gateway_url: str, api_key: Optional[str], model: str, max_tokens: int, temperature: float,
                 top_p: float = 1.0, timeout_s: float = 120.0):
        key = api_key or "unused-on-loopback"
        self.model = model
        self.params = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p}
        self.client = openai.AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key=key, timeout=timeout_s, max_retries=2)
        self.http = httpx.AsyncClient(base_url=gateway_url, timeout=timeout_s, headers={"Authorization": f"Bearer {key}"})

    async def chat(self, session_id: str, messages: list[dict], *, tools: Optional[list[dict]] = None,
                   side: bool = False, seed: Optional[int] = None, max_tokens: Optional[int] = None,
                   task_id: str = "", group_id: str = "", user: str = "") -> AssistantTurn:
        headers = {"X-Session-Id": session_id, "X-Turn-Type": "side" if side else "main"}
        headers.update({k: v for k, v in (("X-Task-Id", task_id), ("X-Group-Id", group_id), ("X-User-Id", user)) if v})
        params = {**self.params, **({"max_tokens": max_tokens} if max_tokens else {}),
                  **({"tools": tools} if tools else {})}
        resp = await self.client.chat.completions.create(model=self.model, messages=messages, seed=seed,
                                                         extra_headers=headers, **params)
        return assistant_turn(resp.choices[0])

    async def score(self, messages: list[dict], response: str, hint: str = "", temperature: float = 1.0) -> list[float]:
        """Log-probs of `response`'s tokens under the current policy (with `hint`: the judge's teacher)."""
        resp = await self.http.post("/v1/score", json={"messages": messages, "response": response, "hint": hint,
                                                       "temperature": temperature})
        resp.raise_for_status()
        return resp.json()["logprobs"]

    async def complete(self, session_id: str, reward: float, text: str = "") -> None:
        resp = await self.http.post(f"/v1/sessions/{session_id}/complete", json={"reward": reward, "text": text})
        resp.raise_for_status()

    async def close(self) -> None:
        await self.client.close()
        await self.http.aclose()
