from clawr1.pool.log import RecordLog
from clawr1.protocol import Ack


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


def test_corrupted_record_stops_the_replay_there(tmp_path):
    path = tmp_path / "a.log"
    log = RecordLog(path, Ack)
    list(log.replay())
    log.append_many([Ack(id="1"), Ack(id="2")])
    log.close()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # flip a bit in the last record's body: its crc no longer matches
    path.write_bytes(bytes(data))
    assert [a.id for a in RecordLog(path, Ack).replay()] == ["1"]
