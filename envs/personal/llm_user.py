"""An optional language-model voice for the simulated user (any OpenAI-compatible endpoint).

What the user wants and whether an answer satisfies it stay rule-based, so the
personalization score stays exact; the model only words the user's next
message (a correction, a re-ask, or thanks plus the next question) from the
situation and the scripted message. When the endpoint fails or says nothing,
the scripted message is used and counted.
"""
from __future__ import annotations

import os
from collections import Counter

import openai

PROMPT = """You are role-playing a user chatting with an AI assistant. You like answers that {likes}.
The assistant just answered: {answer!r}
{situation}
Reply with only your next message to the assistant, one or two short sentences, in your own words.
A message that would do: {scripted}"""

SITUATIONS = {
    "correct": "That answer is not how you like it: you want it to {wrong}. Tell the assistant what to do instead.",
    "reask": "That answer is not how you like it. Do not explain why; just ask your question again.",
    "move_on": "You are done with that question. Move on and ask the next question, keeping it exactly.",
}


class LlmUser:
    def __init__(self, url: str, model: str = "default", api_key_env: str = "", max_tokens: int = 96,
                 temperature: float = 0.7):
        key = os.environ.get(api_key_env, "") if api_key_env else ""
        self.client = openai.AsyncOpenAI(base_url=url, api_key=key or "none", max_retries=1, timeout=120)
        self.model, self.max_tokens, self.temperature = model, max_tokens, temperature
        self.counts: Counter = Counter()

    async def say(self, situation: str, scripted: str, *, likes: str, answer: str, wrong: str = "") -> str:
        """The user's next message in the model's words; the scripted one if the model gives none."""
        prompt = PROMPT.format(likes=likes, answer=answer, scripted=scripted,
                               situation=SITUATIONS[situation].format(wrong=wrong))
        try:
            reply = await self.client.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": prompt}], max_tokens=self.max_tokens,
                temperature=self.temperature)
            text = (reply.choices[0].message.content or "").strip()
        except openai.OpenAIError:
            self.counts["user_llm_errors"] += 1
            return scripted
        if not text:
            self.counts["user_llm_empty"] += 1
            return scripted
        self.counts["user_llm_messages"] += 1
        return text

    async def close(self) -> None:
        await self.client.close()
