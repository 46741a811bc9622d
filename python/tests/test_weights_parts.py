"""A weight set on several devices (parts) from Python: published, opened by name without saying it has parts, read
whole in the publisher's order, never a mix of two generations, held by a reader process while the owner moves on,
and the owner's death seen. The host backend has no devices: ``_parts=`` (tests only) splits a host set into parts,
whose manifests name made-up device UUIDs. The torch tests: on cuda:0 and cuda:1 (two GPUs), and a set on one GPU split
in two parts there (one GPU)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest

import gpu_ipc
import gpu_ipc.weights
from gpu_ipc._weights_parts import PartsReader
from weights_torch import check_stream_waits, cuda_devices, expect, spawn

# The publisher's order interleaves the parts: a reader must give it back, not part 0's tensors then part 1's.
PARTS = {"embed.weight": 0, "layers.0.norm": 1, "layers.0.proj.weight": 0, "layers.1.proj.weight": 1, "step": 1}


def state_dict(generation: int) -> dict[str, np.ndarray]:
    """Every element says its generation (and, in the low byte of the ints, which tensor it is)."""
    return {
        "embed.weight": np.full((16, 8), generation, dtype=np.float32),
        "layers.0.norm": np.full((8,), generation, dtype=np.float16),
        "layers.0.proj.weight": np.full((4, 8), generation, dtype=np.int32),
        "layers.1.proj.weight": np.full((3,), generation * 256 + 1, dtype=np.int64),
        "step": np.array(generation, dtype=np.int64),
    }


def generation_of(tensors: dict[str, Any]) -> set[int]:
    """The generations the tensors say (one: no mix)."""
    seen = set()
    for name, t in tensors.items():
        a = np.from_dlpack(t)
        want = state_dict(0)[name]
        assert a.shape == want.shape and a.dtype == want.dtype, name
        values = a // 256 if name == "layers.1.proj.weight" else a
        seen |= {int(v) for v in np.unique(values)}
    return seen


def publish(sock: str, generation: int = 1, **kw: Any) -> gpu_ipc.weights.Publisher:
    return gpu_ipc.weights.publish(state_dict(generation), "model", socket=sock, _parts=PARTS, **kw)


def test_a_set_of_two_parts_is_opened_by_name_and_read_whole_in_the_publishers_order(sock: str) -> None:
    with publish(sock, checksums=True) as pub:
        assert (pub.parts, pub.generation, pub.backend) == (2, 1, "host")
        with gpu_ipc.weights.open(sock, "model") as r:  # nothing says it has parts
            assert (r.parts, r.generation, r.latest()) == (2, 1, 1)
            for framework in (None, np):
                tensors = r.tensors(framework)
                assert list(tensors) == list(state_dict(1))
                for name, t in tensors.items():
                    assert np.array_equal(np.from_dlpack(t), state_dict(1)[name]), name
            assert r.placement() == {name: (part, None) for name, part in PARTS.items()}
            assert [m[0] for m in r.manifest()] == list(state_dict(1))
            assert r.verify() == 5
            target = {k: np.zeros_like(v) for k, v in state_dict(1).items()}
            assert r.load_into(target) == 5
            assert all(np.array_equal(target[k], v) for k, v in state_dict(1).items())
            assert r.owner_gone is False


def released(r: gpu_ipc.weights.Reader, wait: gpu_ipc.weights.GenerationWait) -> tuple[str, int]:
    """``wait``'s status once it is no longer waiting (within a second)."""
    deadline = time.monotonic() + 1.0
    while r.wait_status(wait)[0] == "waiting":
        assert time.monotonic() < deadline, f"the wait for {wait.generation} was not released within a second"
        time.sleep(0.0005)
    return r.wait_status(wait)


def test_a_watch_follows_the_sets_generation_on_every_part_and_the_owners_end_releases_it(sock: str) -> None:
    with publish(sock) as pub:
        r = gpu_ipc.weights.open(sock, "model")
        assert isinstance(r, PartsReader)
        done = r.watch(1)
        assert done.generation == 1 and r.wait_status(done) == ("published", 1)
        word = np.from_dlpack(done)  # part 0's status word: host memory on the host backend, no copy
        assert word.shape == () and word.dtype == np.int64 and word.ctypes.data == done.status_word
        wait = r.watch(2)
        assert wait.status_word == done.status_word  # one word per part
        other = r._reader.part_of(1).watch(2)  # part 1's own word, which follows the set's generation too
        assert other.status_word != wait.status_word
        time.sleep(0.02)
        assert r.wait_status(wait) == ("waiting", 0) and r.wait_status(other) == ("waiting", 0) and int(word) == 1
        pub.update(state_dict(2))
        assert released(r, wait) == ("published", 2) and released(r, other) == ("published", 2) and int(word) == 2
        with pytest.raises(gpu_ipc.ArgumentError, match="device 0 holds no part"):
            r.watch(3, device=0)
        with pytest.raises(gpu_ipc.GpuIpcError, match="GPU backend"):
            r.wait_on(3)  # a stream wait needs CUDA: on the host backend, watch
        with pytest.raises(gpu_ipc.ArgumentError, match="generations run from 1"):
            r.watch(0)
        pending = [r.watch(3), r._reader.part_of(1).watch(3)]
    for wait in pending:  # the owner closed: released as gone, the newest generation kept
        assert released(r, wait) == ("gone", 2)
    assert int(word) == gpu_ipc.weights.GenerationWait.GONE_BIT | 2
    with pytest.raises(gpu_ipc.OwnerGone):
        r.watch(4)
    r.close()


def test_closing_a_parts_reader_releases_its_pending_waits(sock: str) -> None:
    with publish(sock):
        r = gpu_ipc.weights.open(sock, "model")
        pending = r.watch(5)
        started = time.monotonic()
        r.close()
        assert time.monotonic() - started < 0.5
        assert pending.status_of(int(np.from_dlpack(pending))) == "gone"  # the wait keeps the word


def test_update_and_stage_commit_through_generations_while_a_reader_refreshes_never_mix(sock: str) -> None:
    with publish(sock, keep=1) as pub, gpu_ipc.weights.open(sock, "model") as r:
        stop = threading.Event()
        seen: list[set[int]] = []
        errors: list[BaseException] = []

        def read() -> None:
            try:
                while not stop.is_set():
                    r.refresh()
                    seen.append(generation_of(r.tensors(np)))
            except BaseException as e:  # reported below
                errors.append(e)

        reader = threading.Thread(target=read)
        reader.start()
        try:
            while pub.generation < 300:
                g = pub.generation + 1
                if g % 2:
                    assert pub.update(state_dict(g)) == g
                else:
                    staged = pub.stage(np)
                    assert list(staged) == list(state_dict(g))
                    for name, value in state_dict(g).items():
                        staged[name][...] = value
                    assert pub.commit() == g
                if g % 50 == 0:
                    # The reader takes generation g before the owner goes on, so that it reads during the run however
                    # the threads are scheduled (a loaded machine let it read twice in 300 generations).
                    deadline = time.monotonic() + 10
                    while not (seen and min(seen[-1]) >= g) and not errors and time.monotonic() < deadline:
                        time.sleep(0.001)
        finally:
            stop.set()
            reader.join()
        assert not errors, errors
        assert len({min(s) for s in seen}) >= 6, "the reader saw too few generations to test anything"
        assert all(len(s) == 1 for s in seen), [s for s in seen if len(s) != 1][:3]
        assert r.refresh() == 300 and generation_of(r.tensors()) == {300}


READER = """
import sys, numpy as np, gpu_ipc.weights
r = gpu_ipc.weights.open(sys.argv[1], "model", timeout=10)
t = r.tensors(np)
print("HELD", r.parts, r.generation, flush=True)
sys.stdin.readline()
ok = all(np.all(v[...] == (r.generation * 256 + 1 if k == "layers.1.proj.weight" else r.generation)) for k, v in t.items())
held = r.generation
print("MOVED", held, r.refresh(), ok, list(r.tensors()) == list(t), flush=True)
"""

OWNER = """
import sys, time, numpy as np, gpu_ipc.weights
sd = {"a": np.full((64,), 1, dtype=np.float32), "b": np.full((8,), 1, dtype=np.int64), "c": np.full((3,), 1, dtype=np.int8)}
pub = gpu_ipc.weights.publish(sd, "model", socket=sys.argv[1], _parts={"a": 0, "b": 1, "c": 1})
print("PUBLISHED", pub.generation, flush=True)
time.sleep(60)
"""


def test_a_reader_process_holds_generation_n_of_every_part_while_the_owner_moves_on(sock: str) -> None:
    with publish(sock) as pub:
        child = spawn(READER, sock)
        try:
            assert expect(child, "HELD") == ["2", "1"]
            deadline = time.monotonic() + 10
            while len(pub.readers()) < 1:
                assert time.monotonic() < deadline
                time.sleep(0.002)
            pub.update(state_dict(2))
            pub.update(state_dict(3))
            assert pub.readers() == [(child.pid, 1)]
            assert pub.arenas() == 6  # 1 (held), 2 and 3, on each part
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
            assert expect(child, "MOVED") == ["1", "3", "True", "True"]
            assert child.wait(timeout=30) == 0
        finally:
            child.kill()


def test_the_owner_killed_is_seen_within_a_second_and_held_tensors_stay_readable(sock: str) -> None:
    owner = spawn(OWNER, sock)
    try:
        expect(owner, "PUBLISHED")
        r = gpu_ipc.weights.open(sock, "model")
        assert r.parts == 2 and list(r.placement().values()) == [(0, None), (1, None), (1, None)]
        tensors = r.tensors(np)
        os.kill(owner.pid, signal.SIGKILL)
        killed = time.monotonic()
        owner.wait()
        with pytest.raises(gpu_ipc.OwnerGone):
            r.wait_for(2, timeout=5)
        assert time.monotonic() - killed < 1.0
        assert r.owner_gone
        assert list(tensors) == ["a", "b", "c"] and all(np.all(v == 1) for v in tensors.values())
    finally:
        owner.kill()


def test_parts_are_refused_when_they_say_nothing_right(sock: str) -> None:
    with pytest.raises(gpu_ipc.ArgumentError, match="_parts"):
        gpu_ipc.weights.publish(state_dict(1), "model", socket=sock, _parts={"step": 0})
    with pytest.raises(gpu_ipc.ArgumentError, match="part 1 holds no tensor"):
        gpu_ipc.weights.publish(state_dict(1), "model", socket=sock, _parts={k: 0 if k != "step" else 2
                                                                                   for k in PARTS})
    with publish(sock) as pub:
        with pytest.raises(gpu_ipc.ArgumentError, match="names differ"):
            pub.update({"step": np.array(2, dtype=np.int64)})
        with pytest.raises(gpu_ipc.ArgumentError, match="stream=None"):
            pub.update(state_dict(2), stream=object())
        with pytest.raises(gpu_ipc.ArgumentError, match="one stream per part"):
            pub.update(state_dict(2), stream=[None])
        with pytest.raises(gpu_ipc.ArgumentError, match="no stream for device"):
            pub.update(state_dict(2), stream={0: None})
        assert pub.generation == 1
        # One stream per part (the host backend's parts have no device: their copies take no stream).
        assert pub.update(state_dict(2), stream=[None, None]) == 2
        with gpu_ipc.weights.open(sock, "model") as r:
            target = {k: np.zeros_like(v) for k, v in state_dict(2).items()}
            assert r.load_into(target, stream=[None, None]) == len(target)
            assert all(np.array_equal(target[k], v) for k, v in state_dict(2).items())
            with pytest.raises(gpu_ipc.ArgumentError, match="one stream per part"):
                r.load_into(target, stream=(None, None, None))


TORCH_READER = """
import sys, torch, gpu_ipc.weights
r = gpu_ipc.weights.open(sys.argv[1], "model", timeout=20)
g = r.generation
t = r.tensors(torch)
ok = all(v.device.index == int(k.split(".")[1]) and bool((v == g + int(k.split(".")[2])).all()) for k, v in t.items())
target = {k: torch.zeros_like(v) for k, v in t.items()}
r.load_into(target)
for d in range(torch.cuda.device_count()): torch.cuda.synchronize(d)
ok = ok and all(bool((target[k] == v).all()) and target[k].device == v.device for k, v in t.items())
# The package left torch's current device where it was (cuda:0), though it used every device's context.
ok = ok and torch.cuda.current_device() == 0
print("READ", r.parts, g, list(t) == sys.argv[2].split(","), ok, flush=True)
"""


def publish_three_and_read_them_in_another_process(sock: str, backend: str, devices: int,
                                                   parts: dict[str, int] | None = None) -> None:
    """Publishes generations 1-3 of 12 torch tensors "t.DEVICE.I" (on cuda:DEVICE, every element g + I; the devices
    interleaved in the state_dict's order when ``devices`` is 2) by ``update`` and by ``stage(torch)``+``commit``;
    a reader process opens the set, checks every tensor's device and value, and ``load_into``."""
    import torch  # type: ignore[import-not-found, unused-ignore]

    def weights(g: int) -> dict[str, Any]:
        return {f"t.{i % devices}.{i}": torch.full((1000 + i,), float(g + i), device=f"cuda:{i % devices}")
                for i in range(12)}

    torch.cuda.set_device(0)
    with gpu_ipc.weights.publish(weights(1), "model", socket=sock, backend=backend, _parts=parts) as pub:
        assert pub.parts == 2
        assert pub.update(weights(2)) == 2
        staged = pub.stage(torch)
        assert all(v.device.index == int(k.split(".")[1]) for k, v in staged.items())
        for k, v in weights(3).items():
            staged[k].copy_(v)
        assert pub.commit() == 3
        # Every part's device was used; torch's current device is still the one the caller set.
        assert torch.cuda.current_device() == 0
        child = subprocess.run([sys.executable, "-c", TORCH_READER, sock, ",".join(weights(3))],
                               capture_output=True, text=True, timeout=120)
        assert child.returncode == 0, child.stderr
        assert expect_line(child.stdout, "READ") == ["2", "3", "True", "True"]


@pytest.mark.skipif(cuda_devices() < 2, reason="needs two GPUs and torch")
@pytest.mark.parametrize("backend", ["legacy", "vmm"])
def test_a_torch_state_dict_on_two_gpus_is_read_in_another_process_each_tensor_on_its_device(
    sock: str, backend: str
) -> None:
    publish_three_and_read_them_in_another_process(sock, backend, devices=2)


@pytest.mark.skipif(cuda_devices() < 1, reason="needs a GPU and torch")
@pytest.mark.parametrize("backend", ["legacy", "vmm"])
def test_a_torch_state_dict_split_in_two_parts_on_one_gpu_is_read_whole_in_another_process(
    sock: str, backend: str
) -> None:
    # What a machine of one GPU can run of the parts: both parts on cuda:0 (``_parts``, tests only), the same
    # protocol (two pools behind one socket, part 0 published last, one generation on every part).
    publish_three_and_read_them_in_another_process(sock, backend, devices=1,
                                                   parts={f"t.0.{i}": i % 2 for i in range(12)})


def expect_line(out: str, tag: str) -> list[str]:
    lines = [line for line in out.splitlines() if line.startswith(tag)]
    assert lines, out
    return lines[0].split()[1:]


@pytest.mark.skipif(cuda_devices() < 1, reason="needs a GPU and torch")
@pytest.mark.parametrize("backend", ["legacy", "vmm"])
def test_a_torch_stream_waits_for_a_set_of_parts_next_generation_and_for_the_owners_end(
    sock: str, backend: str
) -> None:
    """Both parts on cuda:0 (``_parts``): the wait is on a part's word, released by the set's publication (part 0's,
    committed last) and by the owner's end."""
    check_stream_waits(sock, backend, parts={"w": 0, "b": 1})
