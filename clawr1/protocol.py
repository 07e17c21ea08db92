"""Typed messages exchanged between the loops, and their compact encoding.

Every message travels as two ZeroMQ frames: a header `clawr1/<schema version>`
and a msgpack body tagged with the message type. A peer that speaks another
schema version gets a `SchemaMismatch` naming both versions, never a garbled
decode.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import msgspec

SCHEMA_VERSION = 6  # 4: TurnAck and JudgeHello (the gateway outbox); 5: the LoRA adapter on TurnRecord and Sample;
# 6: the teacher's log-probs without the hint on Sample (algo.opd_baseline=teacher)
_HEADER_PREFIX = b"clawr1/"


class SchemaMismatch(RuntimeError):
    """The peer speaks another schema version (or is not a clawr1 peer at all)."""


class NextState(msgspec.Struct, kw_only=True):
    """What followed a turn: the signal the judge reads."""

    kind: str  # user | tool | feedback | outcome | none
    text: str = ""
    score: Optional[float] = None  # explicit feedback score, if any
    reward: Optional[float] = None  # environment outcome reward, if any
    done: bool = False


class TurnRecord(msgspec.Struct, tag=True, kw_only=True):
    """One assistant turn exactly as the engine sampled it (gateway -> judge)."""

    session_id: str
    turn_index: int
    segment: int = 0  # bumped when the client's history stops extending the recorded tokens
    main: bool = True
    prompt_ids: list[int]
    response_ids: list[int]
    rollout_logprobs: list[float]  # one per response token, log_softmax(logits / temperature)
    versions: list[int]  # weight version that produced each response token
    temperature: float = 1.0  # the sampling temperature the log-probs were taken at (greedy: 1)
    messages: list[dict[str, Any]]  # as the client sent them
    tools: Optional[list[dict[str, Any]]] = None
    response_text: str = ""
    finish_reason: str = ""
    next_state: Optional[NextState] = None
    group_id: str = ""  # turns sharing a prompt or task, for GRPO baselines (X-Group-Id)
    task_id: str = ""  # the task this turn belongs to, for per-task baselines (X-Task-Id)
    created_at: float = 0.0  # when the engine finished the turn (unix time)
    sent_at: float = 0.0  # when its next state arrived and the gateway queued it for the judge
    ingested: bool = False  # from a pre-collected log: tokens rendered from text, log-probs scored afterwards
    adapter: str = ""  # the LoRA adapter that served the turn, as the engine knew it (`name@vN`); empty: none
    adapter_slot: int = 0  # the trainer's adapter slot for it (lora.per_user: the user's)


class Sample(msgspec.Struct, tag=True, kw_only=True):
    """A training sample (judge -> pool -> trainer).

    `tokens` is prompt + response. Every per-token list below has one entry per
    response token, i.e. `len(tokens) - prompt_len` entries.
    """

    sample_id: str
    group_id: str
    tokens: list[int]
    prompt_len: int
    loss_mask: list[int]
    rollout_logprobs: list[float]
    versions: list[int]
    temperature: float = 1.0  # sampling temperature: rollout log-probs are at it, the trainer recomputes at it
    reward: Optional[float] = None
    teacher_logprobs: Optional[list[float]] = None
    teacher_temperature: float = 1.0  # the temperature the teacher log-probs were taken at
    # the same teacher on the same tokens without the hint (algo.opd_baseline=teacher), at teacher_temperature
    teacher_unhinted_logprobs: Optional[list[float]] = None
    teacher_topk_ids: Optional[list[list[int]]] = None  # per response token: the teacher's k most likely ids
    teacher_topk_logprobs: Optional[list[list[float]]] = None  # and their log-probs
    teacher_version: Optional[int] = None
    task_id: str = ""
    hint: str = ""
    votes: list[int] = msgspec.field(default_factory=list)
    session_id: str = ""
    turn_index: int = 0
    created_at: float = 0.0
    ingested: bool = False  # from a pre-collected log: off-policy by nature, so never dropped as stale
    adapter: str = ""  # the LoRA adapter the turn was sampled with (TurnRecord.adapter)
    adapter_slot: int = 0  # the adapter slot the trainer trains on this sample (lora.per_user: the user's)

    @property
    def response_len(self) -> int:
        return len(self.tokens) - self.prompt_len

    def check(self) -> None:
        """Raise ValueError when the per-token lists do not line up with the tokens."""
        n = self.response_len
        if not self.temperature > 0 or not self.teacher_temperature > 0:
            raise ValueError(f"sample {self.sample_id}: temperatures must be > 0 (sampling {self.temperature}, "
                             f"teacher {self.teacher_temperature})")
        if self.prompt_len < 1 or n < 1:
            raise ValueError(f"sample {self.sample_id}: needs a prompt and a response (prompt_len={self.prompt_len}, tokens={len(self.tokens)})")
        if self.adapter_slot < 0:
            raise ValueError(f"sample {self.sample_id}: adapter_slot must be >= 0, got {self.adapter_slot}")
        for name in ("loss_mask", "rollout_logprobs", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"sample {self.sample_id}: {name} has {len(getattr(self, name))} entries, response has {n}")
        for name in ("teacher_logprobs", "teacher_unhinted_logprobs"):
            values = getattr(self, name)
            if values is not None and len(values) != n:
                raise ValueError(f"sample {self.sample_id}: {name} has {len(values)} entries, response has {n}")
        if self.teacher_unhinted_logprobs is not None and self.teacher_logprobs is None:
            raise ValueError(f"sample {self.sample_id}: teacher_unhinted_logprobs without teacher_logprobs")
        ids, lps = self.teacher_topk_ids, self.teacher_topk_logprobs
        if (ids is None) != (lps is None):
            raise ValueError(f"sample {self.sample_id}: teacher top-k needs both ids and log-probs")
        if ids is not None:
            k = len(ids[0]) if ids else 0
            if len(ids) != n or len(lps) != n or any(len(r) != k for r in ids) or any(len(r) != k for r in lps):
                raise ValueError(f"sample {self.sample_id}: teacher top-k must be {n} rows of the same k ids and log-probs")


class Ack(msgspec.Struct, tag=True, kw_only=True):
    """The pool's answer to a Sample: durable (ok), or refused; `retry` says whether sending it again later may work."""

    id: str
    ok: bool = True
    error: str = ""
    retry: bool = False


class BatchRequest(msgspec.Struct, tag=True, kw_only=True):
    """Trainer -> pool: the batch after `last_batch_id`, at most `batch_size` samples."""

    trainer_version: int
    last_batch_id: int
    batch_size: int


class Batch(msgspec.Struct, tag=True, kw_only=True):
    batch_id: int
    samples: list[Sample]
    dropped_stale: int = 0
    pending: int = 0


class NoBatch(msgspec.Struct, tag=True, kw_only=True):
    """Not enough samples yet; ask again."""

    pending: int
    reason: str = ""


class Commit(msgspec.Struct, tag=True, kw_only=True):
    """Trainer -> pool: every batch up to and including `batch_id` is checkpointed."""

    batch_id: int


class PoolStats(msgspec.Struct, tag=True, kw_only=True):
    pending: int
    received: int
    committed_batch_id: int
    dropped_stale: int


class StatsRequest(msgspec.Struct, tag=True, kw_only=True):
    pass


class WeightsPublished(msgspec.Struct, tag=True, kw_only=True):
    version: int
    step: int
    path: str = ""
    timestamp: float = 0.0


class ErrorReply(msgspec.Struct, tag=True, kw_only=True):
    error: str


def encodable(value: Any) -> Any:
    """`value` with what msgpack cannot hold made so: lone surrogates (valid JSON escapes, not Unicode) become
    '?', integers beyond 64 bits become their decimal text."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**64:
        return str(value)
    if isinstance(value, list):
        return [encodable(v) for v in value]
    if isinstance(value, dict):
        return {encodable(k): encodable(v) for k, v in value.items()}
    return value


def make_encodable(record: TurnRecord) -> None:
    """Make a TurnRecord built from a client's JSON encodable, in place (see encodable): called when encoding it
    failed, so the judge, the outbox and the pool all see the same record."""
    for name in ("session_id", "group_id", "task_id", "response_text", "messages", "tools"):
        setattr(record, name, encodable(getattr(record, name)))
    if record.next_state is not None:
        record.next_state.text = encodable(record.next_state.text)


def turn_key(record: TurnRecord) -> str:
    """A turn's id from served to trained: its Sample's sample_id, its outbox and acknowledgement key."""
    return f"{record.session_id}/{record.segment}/{record.turn_index}"


class TurnAck(msgspec.Struct, tag=True, kw_only=True):
    """Judge -> gateway: these turns are done with, so the gateway's outbox may forget them. `reason` is
    "sample" (the pool acknowledged its Sample) or why it was dropped (no_signal, refused, error...)."""

    keys: list[str]
    reason: str


class JudgeHello(msgspec.Struct, tag=True, kw_only=True):
    """Judge -> gateway, once at start: a (re)started judge holds nothing, so resend every unacknowledged turn."""

    started_at: float


class OutboxNextState(msgspec.Struct, tag=True, kw_only=True):
    """The gateway outbox's note that a served turn's next state arrived (the turn itself is logged when served)."""

    key: str
    next_state: NextState
    sent_at: float


Message = Union[
    TurnRecord, Sample, Ack, BatchRequest, Batch, NoBatch, Commit, PoolStats, StatsRequest,
    WeightsPublished, ErrorReply, TurnAck, JudgeHello,
]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def header() -> bytes:
    return _HEADER_PREFIX + str(SCHEMA_VERSION).encode()


def encode(msg: Message) -> list[bytes]:
    return [header(), _encoder.encode(msg)]


def decode(frames: list[bytes]) -> Message:
    if len(frames) != 2 or not frames[0].startswith(_HEADER_PREFIX):
        raise SchemaMismatch(f"not a clawr1 message ({len(frames)} frames, header {frames[0][:16]!r})")
    theirs = frames[0][len(_HEADER_PREFIX):].decode(errors="replace")
    if theirs != str(SCHEMA_VERSION):
        raise SchemaMismatch(f"peer speaks clawr1 schema v{theirs}, this process speaks v{SCHEMA_VERSION}")
    try:
        return _decoder.decode(frames[1])
    except msgspec.ValidationError as e:
        raise SchemaMismatch(f"malformed clawr1 v{SCHEMA_VERSION} message: {e}") from None


def to_builtins(msg: msgspec.Struct) -> dict:
    return msgspec.to_builtins(msg)
