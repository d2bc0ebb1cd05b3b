"""Slot files, holder files, runtime handles and watchdog specs as typed records: the JSON on
disk keeps the shape it had as plain dicts, so a sweep's engines are read back across an
upgrade. Pure: no engine, no docker."""

from __future__ import annotations

import json
from pathlib import Path

from gridbench.engines.policy import SlotView, choose_slots
from gridbench.engines.runtime import ContainerHandle, ProcessHandle, RuntimeHandle
from gridbench.engines.slots import OwnedEngine, SlotHolder, SlotState, SlotStore
from gridbench.engines.watchdog import WatchdogSpec
from gridbench.util import codec

IDENTITY = {"pid": 4242, "start_time": 123456, "host": "node1", "boot_id": "b00t"}

# a slot file as engines wrote it before the records were typed (the same keys, in this order)
OLD_PROCESS_SLOT = {
    "owner": "/work/sweep",
    "owner_process": IDENTITY,
    "config": "D_f16_n0",
    "fingerprint": "abc123",
    "slots": ["cpu"],
    "handle": {
        "runtime": "process",
        "pid": 5151,
        "name": "gridbench-1a2b3c4d-cpu-d_f16_n0",
        "start_time": 98765,
        "log_path": "logs/engines/D_f16_n0.log",
        "log_offset": 2048,
    },
    "plan": {
        "argv": ["python", "-m", "gridbench.testengines.xllamacpp_server", "--port", "8100"],
        "host": "127.0.0.1",
        "port": 8100,
        "served_model_name": "demo",
    },
    "started_at": "2026-12-03T10:00:00.000+00:00",
    "ready_s": 1.234,
    "version": "b1234",
    "image": {"image": None, "image_id": None, "image_digest": None, "command": ["python", "-m", "x"]},
    "watchdog": {**IDENTITY, "pid": 5152},
}

OLD_DOCKER_SLOT = {
    **OLD_PROCESS_SLOT,
    "slots": ["0", "1"],
    "handle": {
        "runtime": "docker",
        "container_id": "f00d" * 16,
        "name": "gridbench-1a2b3c4d-0-1-d_f16_n0",
        "log_path": "logs/engines/D_f16_n0.log",
    },
    "image": {"image": "llamacpp:local", "image_id": "sha256:1", "image_digest": "llamacpp@sha256:2"},
}


def test_an_old_slot_file_reads_back_typed_and_writes_the_same_json():
    for old in (OLD_PROCESS_SLOT, OLD_DOCKER_SLOT):
        state = codec.from_json(SlotState, json.loads(json.dumps(old)))
        assert json.dumps(codec.to_json(state)) == json.dumps(old)  # same keys, values and order
    state = codec.from_json(SlotState, OLD_PROCESS_SLOT)
    assert state.handle == ProcessHandle(
        pid=5151,
        name="gridbench-1a2b3c4d-cpu-d_f16_n0",
        start_time=98765,
        log_path=Path("logs/engines/D_f16_n0.log"),
        log_offset=2048,
    )
    assert state.plan.argv[0] == "python" and isinstance(state.plan.argv, tuple)
    assert state.plan.base_url == "http://127.0.0.1:8100"
    assert state.image.command == ("python", "-m", "x") and state.owner_process == IDENTITY
    docker = codec.from_json(SlotState, OLD_DOCKER_SLOT)
    assert isinstance(docker.handle, ContainerHandle) and docker.slots == ("0", "1")
    assert "command" not in codec.to_json(docker.image)


def test_a_slot_record_before_its_watchdog_and_one_that_names_no_slots(tmp_path):
    early = {k: v for k, v in OLD_PROCESS_SLOT.items() if k not in ("watchdog", "slots")}
    early["ready_s"] = early["version"] = None  # written before the engine answered
    (tmp_path / "slot-3.json").write_text(json.dumps(early))
    state = SlotStore(tmp_path).read_state("3")
    assert state is not None
    assert state.watchdog is None and state.slots == ("3",) and state.ready_s is None
    assert "watchdog" not in codec.to_json(state)


def test_handles_round_trip_and_compare_by_value():
    for handle in (
        ProcessHandle(pid=1, name="n", start_time=None, log_path=Path("a.log")),
        ContainerHandle(container_id="c0ffee", name="n", log_path=Path("/abs/a.log")),
    ):
        again = codec.from_json(RuntimeHandle, json.loads(json.dumps(codec.to_json(handle))))
        assert again == handle and type(again) is type(handle)
    old = {"runtime": "process", "pid": 7, "name": "n", "start_time": 8, "log_path": "x.log"}
    assert codec.from_json(RuntimeHandle, old).log_offset == 0  # a handle written before log offsets


def test_the_slot_store_reads_what_it_wrote_and_forgets_only_its_engine(tmp_path):
    store = SlotStore(tmp_path)
    state = codec.from_json(SlotState, OLD_DOCKER_SLOT)
    for slot in state.slots:
        store.write_state(slot, state)
    assert json.loads((tmp_path / "slot-0.json").read_text()) == OLD_DOCKER_SLOT
    assert store.read_state("1") == state and store.recorded_slots() == ["0", "1"]
    holder = SlotHolder(config="D_f16_n0", fingerprint="abc123", owner="/work/sweep")
    store.write_holder("0", holder)
    assert json.loads((tmp_path / "holder-0.json").read_text()) == codec.to_json(holder)
    assert store.read_holder("0") == holder and store.read_holder("1") is None
    (tmp_path / "slot-9.json").write_text("{half a reco")  # a torn or foreign file reads as none
    assert store.read_state("9") is None

    other = codec.from_json(SlotState, OLD_PROCESS_SLOT)
    store.write_state("1", other)  # slot 1 now runs another engine
    held = store.try_lock("0")  # a cell holds slot 0
    assert held is not None
    store.forget(state)
    assert store.read_state("0") == state and store.read_state("1") == other
    store.forget(state, held=["0"])  # the holder itself forgets it
    assert store.read_state("0") is None and store.read_state("1") == other
    held.close()


def test_a_watchdog_spec_is_the_old_spec_json():
    state = codec.from_json(SlotState, OLD_PROCESS_SLOT)
    spec = codec.to_json(WatchdogSpec(state, Path("/tmp/slots")))
    keys = ("owner", "owner_process", "config", "fingerprint", "slots", "handle")
    assert spec == {**{k: OLD_PROCESS_SLOT[k] for k in keys}, "slot_dir": "/tmp/slots"}
    again = codec.from_json(WatchdogSpec, json.loads(json.dumps(spec)))
    assert again.engine == codec.from_json(OwnedEngine, spec) and again.engine.handle == state.handle


def view(name: str, state: SlotState | None, *, free: bool = True, alive: bool = True) -> SlotView:
    return SlotView(name, Path(__file__).open() if free else None, state, alive and state is not None, None)


def test_the_policy_reuses_a_warm_engine_and_starts_new_ones_on_empty_slots_first():
    ours = codec.from_json(SlotState, {**OLD_PROCESS_SLOT, "slots": ["1"]})
    views = [view("0", None), view("1", ours), view("2", None)]
    try:
        warm = choose_slots(views, "abc123", 1, owner="/work/sweep", order=["0", "1", "2"])
        assert warm and warm.slots == ("1",) and warm.warm
        new = choose_slots(views, "other", 2, owner="/work/sweep", order=["0", "1", "2"])
        assert new and new.slots == ("0", "2") and not new.warm  # the warm engine stays
        theirs = choose_slots(views, "abc123", 3, owner="/elsewhere", order=["0", "1", "2"])
        assert theirs is None  # another sweep's live engine is not ours to stop
        views[0].holder = SlotHolder(config="D_f16_n0", fingerprint="abc123", owner="/work/sweep")
        assert choose_slots(views, "abc123", 1, owner="/work/sweep", order=["0", "1", "2"]) is None
    finally:
        for v in views:
            if v.lock:
                v.lock.close()
