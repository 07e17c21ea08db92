"""The LoRA payloads SGLang takes, per release (docs/sglang_api_notes.md §6b), against the stand-in engines of
test_sglang_contract.py; and the trainer's adapter sink: versioned loads, the disk fallback, the unloads."""
from __future__ import annotations

import json
import time

import pytest
import torch

from clawr1.config import load_config
from clawr1.engine_api.client import EngineError, SyncEngineClient
from clawr1.engine_api.lora import load_from_tensors_payload, read_current, write_current
from clawr1.serving.sglang import launch_command
from clawr1.trainer.publish import AdapterSink
from tests.serving.test_sglang_contract import SGLANG_0_5_15, SGLANG_0_5_23, FakeEngine, Log, Wire

@pytest.fixture
def fleet():
    """fleet(n, A={...}, B={...}) -> (log, None, engines): stand-in SGLang engines (no weight broadcast here)."""
    made: list[FakeEngine] = []

    def make(n: int, **kw):
        log = Log()
        engines = [FakeEngine(chr(ord("A") + i), log, Wire(log), **kw.get(chr(ord("A") + i), {})) for i in range(n)]
        made.extend(engines)
        return log, None, engines

    yield make
    for e in made:
        e.close()


CONFIG = {"peft_type": "LORA", "r": 2, "lora_alpha": 4.0, "target_modules": ["q_proj"]}
TENSORS = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.arange(8.0).reshape(2, 4),
           "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.ones(6, 2)}


@pytest.mark.parametrize("version, field", [(SGLANG_0_5_15, "serialized_tensors"),
                                            (SGLANG_0_5_23, "serialized_named_tensors")])
def test_tensors_go_in_the_field_each_release_reads(fleet, version, field):
    log, _, (a,) = fleet(1, A={"version": version})
    client = SyncEngineClient(a.url)
    try:
        reply = client.load_lora_adapter_from_tensors("slot0@v1", CONFIG, TENSORS, tp_size=2)
    finally:
        client.close()
    assert reply["success"] and "slot0@v1" in reply["loaded_adapters"]
    body = next(e[3] for e in log.events if e[2] == "/load_lora_adapter_from_tensors")
    assert set(body) == {"lora_name", "config_dict", field}
    held = a.loras["slot0@v1"]
    assert len(held["tensors"]) == (2 if version == SGLANG_0_5_23 else 1)  # 0.5.23: one copy per TP rank
    for copy in held["tensors"]:
        assert set(copy) == set(TENSORS) and all(torch.equal(copy[k], TENSORS[k]) for k in TENSORS)
    assert held["config"] == CONFIG


def test_the_0_5_17_change_is_where_the_list_starts():
    old = load_from_tensors_payload("n", CONFIG, TENSORS, embedded=False, release=(0, 5, 16))
    new = load_from_tensors_payload("n", CONFIG, TENSORS, embedded=False, release=(0, 5, 17), tp_size=4)
    assert isinstance(old["serialized_tensors"], str) and "serialized_named_tensors" not in old
    assert len(new["serialized_named_tensors"]) == 4 and "serialized_tensors" not in new
    embedded = load_from_tensors_payload("n", CONFIG, TENSORS, embedded=True)
    assert embedded["load_format"] == "safetensors" and len(embedded["serialized_named_tensors"]) == 1


def test_a_name_clash_and_an_unknown_unload_are_engine_errors(fleet):
    _, _, (a,) = fleet(1, A={"version": SGLANG_0_5_23})
    client = SyncEngineClient(a.url)
    try:
        client.load_lora_adapter("x", "/adapters/x")
        with pytest.raises(EngineError, match="already loaded") as clash:
            client.load_lora_adapter_from_tensors("x", CONFIG, TENSORS)
        assert clash.value.status == 400
        assert client.unload_lora_adapter("x")["loaded_adapters"] == {}
        with pytest.raises(EngineError, match="not found"):
            client.unload_lora_adapter("x")
    finally:
        client.close()


def test_the_adapter_sink_loads_versions_falls_back_to_disk_and_unloads_the_oldest(fleet, tmp_path):
    log, _, (near, far) = fleet(2, A={"version": SGLANG_0_5_23}, B={"version": SGLANG_0_5_15, "remote": True})
    cfg = load_config(None, [f"run.dir={tmp_path}", "lora.enabled=true", "lora.per_user=true", "lora.slots=2",
                             "serve.backend=sglang", "judge.teacher=frozen"])
    engines = [SyncEngineClient(near.url), SyncEngineClient(far.url)]
    sink = AdapterSink(cfg, engines)
    try:
        for version in (1, 2, 3):
            sink.push_adapters({0: TENSORS, 1: TENSORS}, CONFIG, version)
    finally:
        for e in engines:
            e.close()
    for engine in (near, far):  # the newest and the one before; version 1 was unloaded at version 3
        assert sorted(engine.loras) == ["slot0@v2", "slot0@v3", "slot1@v2", "slot1@v3"]
    assert all("tensors" in held for held in near.loras.values())
    assert all(held["dir"].endswith(f"v{int(n.split('@v')[1]):06d}/slot{n[4]}") for n, held in far.loras.items())
    assert read_current(tmp_path / "adapters") == {"version": 3, "slots": [0, 1]}
    assert sorted(p.name for p in (tmp_path / "adapters").glob("v*")) == ["v000002", "v000003"]
    saved = json.loads((tmp_path / "adapters" / "v000003" / "slot1" / "adapter_config.json").read_text())
    assert saved == CONFIG
    unloads = [e[3]["lora_name"] for e in log.events if e[2] == "/unload_lora_adapter"]
    assert sorted(unloads) == ["slot0@v1", "slot0@v1", "slot1@v1", "slot1@v1"]


def test_sglang_on_cpu_gets_adapters_from_disk_and_never_their_tensors(fleet, tmp_path):
    log, _, (cpu,) = fleet(1, A={"device": "cpu"})
    cfg = load_config(None, [f"run.dir={tmp_path}", "lora.enabled=true", "lora.per_user=true", "lora.slots=1",
                             "serve.backend=sglang", "judge.teacher=frozen"])
    client = SyncEngineClient(cpu.url)
    try:
        assert not client.update_protocol().adapter_tensors
        with pytest.raises(EngineError, match="on CPU takes adapters from disk only"):
            client.load_lora_adapter_from_tensors("x", CONFIG, TENSORS)
        sink = AdapterSink(cfg, [client])
        for version in (1, 2):
            sink.push_adapters({0: TENSORS}, CONFIG, version)
    finally:
        client.close()
    assert not cpu.dead and not any(e[2] == "/load_lora_adapter_from_tensors" for e in log.events)
    assert {n: held["dir"].endswith(f"v{int(n.split('@v')[1]):06d}/slot0") for n, held in cpu.loras.items()} == {
        "slot0@v1": True, "slot0@v2": True}


def test_a_resumed_trainers_republish_of_the_current_version_keeps_what_the_engine_holds(fleet, tmp_path):
    """The engine started on current.json's adapters (v3); the resumed trainer republishes its checkpoint, v3:
    nothing is unloaded (an unload would wait for every request in flight on them), and the next publish keeps v3
    as the version before."""
    log, _, (engine,) = fleet(1, A={"unload_delay_s": 30.0})  # an unload would outlast this test's patience
    cfg = load_config(None, [f"run.dir={tmp_path}", "lora.enabled=true", "serve.backend=sglang",
                             "judge.teacher=frozen"])
    write_current(tmp_path / "adapters", 3, [0])
    engine.loras["slot0@v3"] = {"dir": "loaded at the engine's start"}
    client = SyncEngineClient(engine.url)
    try:
        sink = AdapterSink(cfg, [client])
        t0 = time.monotonic()
        sink.push_adapters({0: TENSORS}, CONFIG, 3)
        assert time.monotonic() - t0 < 10
        assert engine.loras["slot0@v3"] == {"dir": "loaded at the engine's start"}
        assert not any(e[2] == "/unload_lora_adapter" for e in log.events)
        engine.unload_delay_s = 0.0
        sink.push_adapters({0: TENSORS}, CONFIG, 4)
    finally:
        client.close()
    assert sorted(engine.loras) == ["slot0@v3", "slot0@v4"]


def test_the_sink_replaces_a_leftover_adapter_once_and_outlives_a_slow_unload(fleet, tmp_path):
    log, _, (stuck, slow) = fleet(2, A={"stuck_loras": True}, B={"unload_delay_s": 1.0})
    cfg = load_config(None, [f"run.dir={tmp_path}", "lora.enabled=true", "serve.backend=sglang",
                             "judge.teacher=frozen"])
    stuck.loras["slot0@v1"] = {"dir": "left by a crashed trainer"}  # and it will not let go of it
    client = SyncEngineClient(stuck.url)
    try:
        with pytest.raises(EngineError, match="already loaded"):
            AdapterSink(cfg, [client]).push_adapters({0: TENSORS}, CONFIG, 1)
    finally:
        client.close()
    tries = [e for e in log.events if e[1] == "A" and e[2] == "/load_lora_adapter_from_tensors"]
    assert len(tries) == 2  # the load, then once more after the unload: not again and again

    client = SyncEngineClient(slow.url, timeout_s=0.3)  # its unloads outlast the client's patience
    try:
        sink = AdapterSink(cfg, [client])
        for version in (1, 2, 3, 4):  # from version 3 on, each publish unloads a stale version, and times out
            sink.push_adapters({0: TENSORS}, CONFIG, version)
    finally:
        client.close()
    deadline = time.monotonic() + 60  # the engine finishes the unloads it was asked for, each 1 s late
    while sorted(slow.loras) != ["slot0@v3", "slot0@v4"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(slow.loras) == ["slot0@v3", "slot0@v4"]  # every version published; the stale ones gone


def test_launch_flags_for_lora():
    cfg = load_config(None, ["serve.backend=sglang", "lora.enabled=true", "lora.per_user=true", "lora.slots=4",
                             "lora.targets=[linear_qkv,linear_fc2]", "serve.max_lora_rank=32", "judge.teacher=frozen"])
    cmd = launch_command(cfg, "/models/m", 30000)
    at = cmd.index("--enable-lora")
    assert cmd[at:at + 14] == ["--enable-lora", "--max-lora-rank", "32", "--lora-target-modules", "down_proj", "k_proj",
                               "q_proj", "v_proj", "--max-loras-per-batch", "13", "--max-loaded-loras", "13",
                               "--weight-version", "0"]
    plain = launch_command(load_config(None, ["serve.backend=sglang"]), "/models/m", 30000)
    assert "--enable-lora" not in plain
