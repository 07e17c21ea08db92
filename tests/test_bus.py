import threading
import time

import pytest

from clawr1 import bus, protocol
from clawr1.ports import free_port
from clawr1.protocol import Ack, ErrorReply, StatsRequest, WeightsPublished


def _addr():
    return f"tcp://127.0.0.1:{free_port()}"


def test_rpc_round_trip_and_error_reply():
    addr = _addr()
    server = bus.RpcServer(addr)

    def serve():
        for _ in range(2):
            route, msg, err = server.recv()
            server.reply(route, Ack(id="ok") if isinstance(msg, StatsRequest) else ErrorReply(error="nope"))

    t = threading.Thread(target=serve)
    t.start()
    client = bus.RpcClient(addr, timeout_s=5)
    assert client.call(StatsRequest()) == Ack(id="ok")
    with pytest.raises(RuntimeError, match="nope"):
        client.call(WeightsPublished(version=1, step=1))
    t.join()
    client.close()
    server.close()


def test_rpc_times_out_without_a_server():
    client = bus.RpcClient(_addr(), timeout_s=0.3)
    t0 = time.monotonic()
    with pytest.raises(bus.BusTimeout):
        client.call(StatsRequest())
    assert time.monotonic() - t0 < 30  # the 0.3 s timeout, not a wait without end (machine load aside)
    client.close()


def test_server_answers_a_wrong_schema_with_an_error_not_a_crash():
    addr = _addr()
    server = bus.RpcServer(addr)
    import zmq

    raw = bus.socket(zmq.Context.instance(), zmq.DEALER)
    raw.connect(addr)
    raw.send_multipart([b"id1", b"clawr1/42", b"\x80"])
    route, msg, err = server.recv()
    assert msg is None and "v42" in err
    server.reply(route, ErrorReply(error=err))
    frames = raw.recv_multipart()
    assert frames[0] == b"id1" and "v42" in protocol.decode(frames[1:]).error
    raw.close(0)
    server.close()


def test_push_pull_respects_the_high_water_mark():
    import zmq

    addr = _addr()
    push = bus.push_socket(addr, hwm=5, linger_ms=0)
    sent = 0
    try:
        for _ in range(100):  # nobody pulls: sends must stop at the bound, not grow without limit
            push.send_multipart(protocol.encode(Ack(id="x")), flags=zmq.NOBLOCK)
            sent += 1
    except zmq.Again:
        pass
    assert sent <= 10
    push.close(0)
