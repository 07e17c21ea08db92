import pytest

from clawr1.record_log import CorruptLog, RecordLog
from clawr1.protocol import Ack, Commit


def write(path, acks) -> bytes:
    log = RecordLog(path, Ack)
    list(log.replay())
    log.append_many(acks)
    log.close()
    return path.read_bytes()


def test_replay_returns_what_was_appended(tmp_path):
    log = RecordLog(tmp_path / "a.log", Ack)
    assert list(log.replay()) == []
    log.append(Ack(id="1"))
    log.append_many([Ack(id="2"), Ack(id="3", ok=False, error="e")])
    log.close()
    again = RecordLog(tmp_path / "a.log", Ack)
    assert [a.id for a in again.replay()] == ["1", "2", "3"]


def test_torn_tail_is_cut_and_appends_continue(tmp_path):
    path = tmp_path / "a.log"
    log = RecordLog(path, Ack)
    list(log.replay())
    log.append_many([Ack(id="1"), Ack(id="2")])
    log.close()
    whole = path.read_bytes()
    path.write_bytes(whole + whole[:7])  # a crash in the middle of writing a third record
    log = RecordLog(path, Ack)
    assert [a.id for a in log.replay()] == ["1", "2"]
    assert log.torn_bytes == 7 and path.read_bytes() == whole
    log.append(Ack(id="3"))
    log.close()
    assert [a.id for a in RecordLog(path, Ack).replay()] == ["1", "2", "3"]


def test_a_damaged_last_record_is_a_torn_tail(tmp_path):
    path = tmp_path / "a.log"
    whole = write(path, [Ack(id="1"), Ack(id="2")])
    data = bytearray(whole)
    data[-1] ^= 0xFF  # the last record's body no longer matches its crc, and nothing follows it
    path.write_bytes(bytes(data))
    log = RecordLog(path, Ack)
    assert [a.id for a in log.replay()] == ["1"]
    assert 0 < log.torn_bytes < len(whole) and len(path.read_bytes()) == len(whole) - log.torn_bytes


def test_a_zero_filled_tail_is_torn_not_a_run_of_empty_records(tmp_path):
    path = tmp_path / "a.log"
    whole = write(path, [Ack(id="1")])
    path.write_bytes(whole + bytes(64))  # a filesystem that extended the file but never wrote the data
    log = RecordLog(path, Ack)
    assert [a.id for a in log.replay()] == ["1"] and log.torn_bytes == 64 and path.read_bytes() == whole


def test_corruption_in_the_middle_is_refused_and_loses_nothing(tmp_path):
    path = tmp_path / "a.log"
    whole = write(path, [Ack(id=str(i)) for i in range(5)])
    first_len = len(write(tmp_path / "one.log", [Ack(id="0")]))
    data = bytearray(whole)
    data[first_len + 9] ^= 0xFF  # a flipped bit in the body of the second record
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptLog) as err:
        list(RecordLog(path, Ack).replay())
    message = str(err.value)
    assert str(path) in message and f"at byte {first_len}" in message and "not a torn write" in message
    assert path.read_bytes() == bytes(data)  # nothing cut: the three good records after it are still there
    data[first_len + 9] ^= 0xFF  # repaired, every record comes back
    path.write_bytes(bytes(data))
    assert [a.id for a in RecordLog(path, Ack).replay()] == ["0", "1", "2", "3", "4"]


def test_an_intact_record_of_another_type_is_refused(tmp_path):
    path = tmp_path / "a.log"
    write(path, [Ack(id="1")])
    with pytest.raises(CorruptLog, match="at byte 0 is intact but not a valid"):
        list(RecordLog(path, Commit).replay())
