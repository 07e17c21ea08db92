"""Personal-agent environment: one simulated user with hidden answer-style preferences.

The user asks addition questions through the gateway. When an answer violates
its profile it either corrects the agent with a directive ("No. Please put the
answer in <ans> tags.") or, some of the time, just re-asks. When the answer
fits, it thanks the agent and moves on to the next question. The last turn of
a session gets an explicit outcome through the gateway's complete endpoint.
With `user_llm_url` set, a language model words those messages (llm_user.py).

The personalization score is the fraction of held-out first responses (new
sessions, questions never trained on) that satisfy every preference of the
profile.
"""
from __future__ import annotations

import asyncio
import itertools
import random
from dataclasses import dataclass, field
from typing import Any

from clawr1.environment import ChatClient
from envs.personal.llm_user import LlmUser
from envs.personal.phrases import CORRECTION_OPENERS, HELDOUT_COMPLAINTS, MOVE_ON, REASK, STILL_WRONG, SYSTEM_PROMPT
from envs.personal.preferences import KINDS, OPTIONS, READERS, Style, directive_text, free_wish_text, violations
from envs.personal.questions import heldout_questions, train_question
from envs.personal.teacher_probe import probe


@dataclass
class PersonalEnvConfig:
    kinds: list[str] = field(default_factory=lambda: list(KINDS))  # preference kinds the user cares about
    profile_seed: int = 0
    # several users in one run (with lora.per_user, one adapter each): their profile seeds. Episodes take turns
    # among them and name their user; held-out scores are per user (personalization_score_u<seed>) and their
    # mean. Empty: the one user of profile_seed.
    users: list[int] = field(default_factory=list)
    # the kinds each of `users` holds, by profile seed (a user not listed: `kinds`). Each keeps the option their
    # full profile draws for a kind, so a user's wish never depends on which other kinds are in play
    user_kinds: dict[int, list[str]] = field(default_factory=dict)
    # GRPO groups: each training episode plays this many sessions of one user asking the same questions (their own
    # samples); the first answers to the same question share a group id (match pool.group_size). A retry after a
    # correction, which only some sessions reach, has no group (the EMA baseline): a group the pool waits for
    # would otherwise stay short until pool.group_timeout_s
    group_size: int = 1
    questions_per_session: int = 2
    max_corrections: int = 1
    implicit_rate: float = 0.2  # share of violations answered by re-asking instead of a directive
    # optional: word the user's messages with a language model (OpenAI-compatible endpoint, e.g. http://host:8000/v1)
    user_llm_url: str = ""
    user_llm_model: str = "default"
    user_llm_api_key_env: str = ""  # name of the environment variable holding the endpoint's key, if any
    # at every evaluation also measure the teacher (teacher_probe.py: hint uptake and signal quality per kind);
    # needs a client that can score responses (clawr1's gateway), skipped otherwise
    probe_teacher: bool = True
    # the hint the probe gives the teacher: "user" (the wishes in the user's words, as phrasing says them) or
    # "directive" (the canonical directives: what the rules judge writes with judge.rules_hint=directive when its
    # map reads the wish right)
    probe_hint: str = "user"
    # the probe's AUC of the teacher's gap per kind as well as the uptake (one scoring pass per kind: about 60% of
    # the probe's time on a real model); off: uptake only
    probe_signal: bool = True
    # how answers are read: "exact" (the tiny model's shapes only) or "free_text" (a part counts wherever it
    # appears: for pretrained models, which answer in their own words; preferences.read_free_text)
    reader: str = "exact"
    # how the user words a wish: "canonical" (the directive the tiny model's warm start trained on, word for word)
    # or "free" (phrases.PHRASINGS' held-out wordings, and vague complaints that name no option)
    phrasing: str = "canonical"
    vague_rate: float = 0.2  # free: share of corrections that are a vague complaint (no hint in them)

    def __post_init__(self) -> None:
        if self.phrasing not in ("canonical", "free"):
            raise ValueError(f"personal env: phrasing must be 'canonical' or 'free', got {self.phrasing!r}")
        if self.probe_hint not in ("user", "directive"):
            raise ValueError(f"personal env: probe_hint must be 'user' or 'directive', got {self.probe_hint!r}")
        if not 0 <= self.vague_rate <= 1:
            raise ValueError(f"personal env: vague_rate must be in [0, 1], got {self.vague_rate}")
        if self.reader not in READERS:
            raise ValueError(f"personal env: reader must be one of {list(READERS)}, got {self.reader!r}")
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown or not self.kinds:
            raise ValueError(f"personal env: kinds must be a non-empty subset of {list(KINDS)}, got {self.kinds}")
        self.user_kinds = {int(u): list(k) for u, k in self.user_kinds.items()}  # JSON and YAML files: str keys
        for user, kinds in self.user_kinds.items():
            if user not in self.users:
                raise ValueError(f"personal env: user_kinds names user {user}, who is not in users {self.users}")
            if not kinds or any(k not in KINDS for k in kinds):
                raise ValueError(f"personal env: user_kinds[{user}] must be a non-empty subset of {list(KINDS)}, "
                                 f"got {kinds}")
        if self.group_size < 1:
            raise ValueError(f"personal env: group_size must be >= 1, got {self.group_size}")


def make_profile(seed: int, kinds: list[str]) -> Style:
    """The hidden preferences of the user with this seed, over `kinds` (in that order); different seeds give
    different users. Every kind is drawn, so a user's option for a kind is the same whatever `kinds` holds."""
    rng = random.Random(f"profile-{seed}")
    drawn = {kind: rng.choice(OPTIONS[kind]) for kind in KINDS}
    return {kind: drawn[kind] for kind in kinds}


class PersonalEnv:
    """A `clawr1.environment.Environment`: sessions with one simulated user; scored on held-out first answers."""

    def __init__(self, args: dict[str, Any], seed: int = 0):
        self.cfg = PersonalEnvConfig(**args)
        seeds = self.cfg.users or [self.cfg.profile_seed]
        self.profiles = {f"u{s}": make_profile(s, self.cfg.user_kinds.get(s, self.cfg.kinds)) for s in seeds}
        self.profile = next(iter(self.profiles.values()))
        self.named_users = bool(self.cfg.users)  # requests name their user only when the run has several
        self._next_user = itertools.cycle(self.profiles)
        self.read = READERS[self.cfg.reader]
        per_user = [f"personalization_score_{u}" for u in self.profiles] if self.named_users else []
        self.held_kinds = [k for k in KINDS if any(k in p for p in self.profiles.values())]  # any user's
        self.eval_metrics = ("personalization_score", *per_user, *(f"pref_{kind}" for kind in self.held_kinds))
        self.seed = seed
        c = self.cfg
        self.user_llm = LlmUser(c.user_llm_url, c.user_llm_model, c.user_llm_api_key_env) if c.user_llm_url else None

    def describe(self) -> dict[str, Any]:
        return {"profiles": self.profiles} if self.named_users else {"profile": self.profile}

    async def episode(self, client: ChatClient, session_id: str, rng: random.Random) -> dict[str, float]:
        """One session of a few questions with the next user in turn (group_size > 1: that many sessions of the
        user asking the same questions, one GRPO group per question's first answers). Returns episode metrics."""
        user = next(self._next_user)
        n = self.cfg.group_size
        if n == 1:
            return await self._session(client, session_id, user, rng, rng)
        questions_seed = rng.random()
        members = await asyncio.gather(*(
            self._session(client, f"{session_id}-{i}", user, random.Random(questions_seed),
                          random.Random(rng.random()), group=session_id) for i in range(n)))
        return {key: sum(m[key] for m in members) / n for key in members[0]}

    async def _session(self, client: ChatClient, session_id: str, user: str, questions: random.Random,
                       rng: random.Random, group: str = "") -> dict[str, float]:
        """One session: `questions` draws the questions, `rng` how the user reacts; with `group`, a question's first
        answer has the group id of the group and the question's position."""
        profile, name = self.profiles[user], user if self.named_users else ""
        messages = [{"role": "system", "content": SYSTEM_PROMPT}]
        first_ok = corrections = reasks = 0
        next_user = (question := train_question(questions)).text
        satisfied = False
        for q_index in range(self.cfg.questions_per_session):
            tries = 0
            while True:
                messages.append({"role": "user", "content": next_user})
                extra = {"user": name} if name else {}
                if group and tries == 0:
                    extra["group_id"] = f"{group}-q{q_index}"
                answer = (await client.chat(session_id, messages, **extra)).content
                messages.append({"role": "assistant", "content": answer})
                wrong = violations(answer, profile, self.read)
                satisfied = not wrong
                if tries == 0:
                    first_ok += satisfied
                if satisfied or tries >= self.cfg.max_corrections:
                    break
                tries += 1
                if rng.random() < self.cfg.implicit_rate:
                    reasks += 1
                    next_user = await self._say(profile, "reask", rng.choice(REASK).format(q=question.text), answer)
                else:
                    corrections += 1
                    next_user = await self._say(profile, "correct", self._correction(wrong, rng), answer, wrong)
            if q_index + 1 < self.cfg.questions_per_session:
                question = train_question(questions)
                prefix = "" if satisfied else STILL_WRONG.format(directive=self._wish(wrong, rng)) + " "
                next_user = await self._say(profile, "move_on", prefix + rng.choice(MOVE_ON).format(q=question.text),
                                            answer)
        await client.complete(session_id, reward=1.0 if satisfied else -1.0,
                              text="" if satisfied else self._wish(violations(answer, profile, self.read), rng))
        n = self.cfg.questions_per_session
        return {"first_try_ok": first_ok / n, "corrections": corrections, "reasks": reasks}

    def _wish(self, wanted: Style, rng: random.Random) -> str:
        """What the user asks for, in their words (canonical: the warm start's directive; draws nothing)."""
        return directive_text(wanted) if self.cfg.phrasing == "canonical" else free_wish_text(wanted, rng)

    def _correction(self, wrong: Style, rng: random.Random) -> str:
        if self.cfg.phrasing == "canonical":
            return "No. " + directive_text(wrong)
        if rng.random() < self.cfg.vague_rate:
            return rng.choice(HELDOUT_COMPLAINTS)
        return rng.choice(CORRECTION_OPENERS) + free_wish_text(wrong, rng)

    async def _say(self, profile: Style, situation: str, scripted: str, answer: str, wrong: Style | None = None) -> str:
        if self.user_llm is None:
            return scripted
        likes = directive_text(profile)[len("Please "):-1]
        wanted = directive_text(wrong)[len("Please "):-1] if wrong else ""
        return await self.user_llm.say(situation, scripted, likes=likes, answer=answer, wrong=wanted)

    def report(self) -> dict[str, float]:
        """Counters for the rollout's metrics."""
        return dict(self.user_llm.counts) if self.user_llm else {}

    async def evaluate(self, client: ChatClient, n: int, session_prefix: str, concurrency: int = 16) -> dict[str, float]:
        """Personalization score on held-out first responses (side turns: they never train); with several users,
        each user's (their own `n` answers, from their own adapter) and the mean of those."""
        slots = asyncio.Semaphore(concurrency)

        async def first_response(user: str, i: int, text: str) -> str:
            messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]
            named = {"user": user} if self.named_users else {}
            async with slots:
                turn = await client.chat(f"{session_prefix}-{user}-{i}", messages, side=True,
                                         seed=self.seed * 100_003 + i, **named)
                return turn.content

        questions = heldout_questions(n, self.seed)
        per_user = {}
        for user, profile in self.profiles.items():
            answers = await asyncio.gather(*(first_response(user, i, q.text) for i, q in enumerate(questions)))
            per_user[user] = (answers, [violations(a, profile, self.read) for a in answers])
        out: dict[str, Any] = {}
        for user, (_, wrong) in per_user.items():
            out[f"personalization_score_{user}"] = sum(not w for w in wrong) / n
            out.update({f"pref_{kind}_{user}": sum(kind not in w for w in wrong) / n for kind in self.profiles[user]})
        out["personalization_score"] = sum(out[f"personalization_score_{u}"] for u in per_user) / len(per_user)
        for kind in self.held_kinds:  # over the users who hold the kind
            held = [out[f"pref_{kind}_{u}"] for u in per_user if kind in self.profiles[u]]
            out[f"pref_{kind}"] = sum(held) / len(held)
        if not self.named_users:  # one user: the plain names only
            out = {k: v for k, v in out.items() if not k.endswith(f"_{next(iter(per_user))}")}
        answers = next(iter(per_user.values()))[0]
        if self.cfg.probe_teacher and not self.named_users and hasattr(client, "score"):  # one profile to probe
            wording = random.Random(f"probe-{self.seed}")  # the hint in the user's words, the same at every evaluation
            hint = directive_text if self.cfg.probe_hint == "directive" else lambda wanted: self._wish(wanted, wording)
            out.update(await probe(client, [q.text for q in questions], answers, self.profile, session_prefix,
                                   self.seed * 100_003, self.read, hint, self.cfg.probe_signal))
        return out
