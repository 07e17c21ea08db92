import msgspec
import pytest

from clawr1 import protocol
from clawr1.protocol import Ack, NextState, Sample, SchemaMismatch, TurnRecord, WeightsPublished


def _record():
    return TurnRecord(session_id="s", turn_index=2, prompt_ids=[1, 2, 3], response_ids=[4, 5],
                      rollout_logprobs=[-0.5, -0.25], versions=[3, 4], messages=[{"role": "user", "content": "hi"}],
                      next_state=NextState(kind="user", text="No. Please use tags."))


def test_round_trip_keeps_every_field():
    rec = _record()
    back = protocol.decode(protocol.encode(rec))
    assert back == rec and back.next_state.text == "No. Please use tags."


def test_header_carries_the_schema_version():
    frames = protocol.encode(WeightsPublished(version=3, step=3))
    assert frames[0] == f"clawr1/{protocol.SCHEMA_VERSION}".encode()


def test_other_schema_version_is_named_in_the_error():
    frames = protocol.encode(Ack(id="x"))
    frames[0] = b"clawr1/99"
    with pytest.raises(SchemaMismatch, match=rf"v99.*v{protocol.SCHEMA_VERSION}"):
        protocol.decode(frames)


def test_foreign_and_malformed_messages_are_rejected():
    with pytest.raises(SchemaMismatch, match="not a clawr1 message"):
        protocol.decode([b"hello"])
    with pytest.raises(SchemaMismatch, match="malformed"):
        protocol.decode([protocol.header(), msgspec.msgpack.encode({"type": "Ack"})])


def test_sample_check_catches_misaligned_lists():
    good = Sample(sample_id="a", group_id="a", tokens=[1, 2, 3, 4], prompt_len=2, loss_mask=[1, 1],
                  rollout_logprobs=[-1.0, -2.0], versions=[0, 0])
    good.check()
    bad = msgspec.structs.replace(good, teacher_logprobs=[-1.0])
    with pytest.raises(ValueError, match="teacher_logprobs has 1 entries, response has 2"):
        bad.check()
