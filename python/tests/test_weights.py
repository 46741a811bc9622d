"""Weight sets between processes (gpu_ipc.weights.publish / open) on the host backend: every tensor read in place,
generations held while the owner publishes more, load_into in place, dead owners and readers, hostile input."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any


import numpy as np
import pytest

import gpu_ipc
import gpu_ipc.weights
from weights_torch import check_stream_waits, cuda_devices, expect, spawn


def state_dict(generation: int) -> dict[str, np.ndarray]:
    """A small state_dict of mixed dtypes and shapes whose every element says its generation."""
    return {
        "embed.weight": np.full((16, 8), generation, dtype=np.float32),
        "layers.0.norm": np.full((8,), generation, dtype=np.float16),
        "layers.0.proj.weight": np.full((4, 8), generation % 127, dtype=np.int8),
        "step": np.array(generation, dtype=np.int64),
    }


def assert_generation(tensors: dict[str, gpu_ipc.weights.WeightsTensor], generation: int) -> None:
    for name, t in tensors.items():
        a = np.from_dlpack(t)
        want = state_dict(generation)[name]
        assert a.shape == want.shape and a.dtype == want.dtype, name
        assert np.array_equal(a, want), f"{name} of generation {generation}"


def test_publish_open_read_every_tensor_in_place(sock: str) -> None:
    with gpu_ipc.weights.publish(state_dict(1), "llama", socket=sock, checksums=True) as pub:
        assert pub.generation == 1 and pub.backend == "host"
        with gpu_ipc.weights.open(sock, "llama") as r:
            assert r.generation == 1 and r.latest() == 1
            tensors = r.tensors()
            assert sorted(tensors) == sorted(state_dict(1))
            assert_generation(tensors, 1)
            assert tensors["embed.weight"].dtype == "float32" and tensors["embed.weight"].shape == (16, 8)
            assert np.from_dlpack(tensors["step"]).ctypes.data == tensors["step"].ptr  # no copy
            assert r.verify() == 4
            manifest = {name: (dtype, shape, offset) for name, dtype, shape, _s, offset, _c in r.manifest()}
            assert manifest["layers.0.norm"][:2] == ("float16", [8])
            assert all(offset % 256 == 0 for _d, _s, offset in manifest.values())


def test_a_reader_keeps_its_generation_until_it_refreshes(sock: str) -> None:
    with gpu_ipc.weights.publish(state_dict(1), "m", socket=sock) as pub:
        r = gpu_ipc.weights.open(sock, "m")
        held = r.tensors()
        assert pub.update(state_dict(2)) == 2
        assert pub.update(state_dict(3)) == 3
        assert r.latest() == 3 and r.generation == 1
        assert_generation(held, 1)  # generation 1 was retired while held: its bytes are intact
        wait_for_readers(pub, 1)
        assert pub.readers() == [(os.getpid(), 1)]
        assert r.refresh() == 3
        assert_generation(r.tensors(), 3)
        assert_generation(held, 1)  # old views stay valid until dropped
        assert sorted(pub.readers()) == [(os.getpid(), 1), (os.getpid(), 3)]
        del held
        assert pub.readers() == [(os.getpid(), 3)]
        assert r.wait_for(3, timeout=0.01) == 3
        with pytest.raises(gpu_ipc.Timeout):
            r.wait_for(4, timeout=0.1)
        r.close()
        assert r.closed


def test_stage_and_commit_write_in_place(sock: str) -> None:
    with gpu_ipc.weights.publish(state_dict(1), "m", socket=sock) as pub:
        staged = pub.stage()
        for name, t in staged.items():
            np.from_dlpack(t)[...] = state_dict(2)[name]
        assert pub.commit() == 2
        r = gpu_ipc.weights.open(sock, "m")
        assert r.generation == 2
        assert_generation(r.tensors(), 2)


def test_tensors_of_a_framework_are_cut_from_one_import_of_the_arena(sock: str) -> None:
    with gpu_ipc.weights.publish(state_dict(1), "m", socket=sock) as pub:
        r = gpu_ipc.weights.open(sock, "m")
        cut = r.tensors(np)
        assert r.tensors("numpy").keys() == cut.keys() == state_dict(1).keys()
        views = r.tensors()
        for name, a in cut.items():
            want = state_dict(1)[name]
            assert isinstance(a, np.ndarray) and a.dtype == want.dtype and a.shape == want.shape, name
            assert np.array_equal(a, want), name
            assert a.ctypes.data == views[name].ptr, f"{name}: a view in place, not a copy"
        arena, (names, runs, order) = r._reader.arena()
        assert arena.generation == 1 and arena.dtype == "uint8"
        assert names == list(state_dict(1)) and sorted(order) == list(range(4))
        # Four tensors of four element types: four runs of one, each at a whole 256 bytes inside the arena.
        assert sorted((dtype, count, shape) for dtype, count, shape, _st, _o, _s in runs) == sorted(
            (str(a.dtype), 1, list(a.shape)) for a in state_dict(1).values()
        )
        assert all(o % 256 == 0 and o < arena.shape[0] for _d, _c, _sh, _st, o, _s in runs)
        assert [run[3] for run in runs if run[2] == [16, 8]] == [[8, 1]]
        del views
        # The cut arrays hold their generation: it stays intact while the owner publishes past it.
        pub.update(state_dict(2))
        pub.update(state_dict(3))
        r.refresh()
        wait_for_readers(pub, 1)
        assert sorted(pub.readers()) == [(os.getpid(), 1), (os.getpid(), 3)]
        assert all(np.array_equal(a, state_dict(1)[name]) for name, a in cut.items())
        del cut, arena, a  # (a: the loop's last array)
        assert pub.readers() == [(os.getpid(), 3)]


def test_other_frameworks_get_one_import_per_tensor(sock: str) -> None:
    """A framework without a cut (JAX, say) gets ``framework.from_dlpack`` of each tensor's own view."""

    class Framework:
        __name__ = "someframework"
        calls = 0

        @classmethod
        def from_dlpack(cls, x: gpu_ipc.weights.WeightsTensor) -> np.ndarray:
            cls.calls += 1
            return np.from_dlpack(x)

    with gpu_ipc.weights.publish(state_dict(4), "m", socket=sock):
        r = gpu_ipc.weights.open(sock, "m")
        got = r.tensors(Framework)
        assert Framework.calls == 4
        assert all(np.array_equal(a, state_dict(4)[name]) for name, a in got.items())
        with pytest.raises(gpu_ipc.ArgumentTypeError, match="framework"):
            r.tensors(42)


def test_the_garbage_collector_is_held_off_while_a_generation_is_cut_and_left_as_it_was(sock: str) -> None:
    """Thousands of tensor objects made at once would start collections over the whole process: the cut holds the
    collector off while it makes them, then enables it again, and leaves a disabled one disabled."""
    import gc

    class Framework:
        __name__ = "someframework"
        enabled: list[bool] = []

        @classmethod
        def from_dlpack(cls, x: gpu_ipc.weights.WeightsTensor) -> np.ndarray:
            cls.enabled.append(gc.isenabled())
            return np.from_dlpack(x)

    with gpu_ipc.weights.publish(state_dict(4), "m", socket=sock):
        r = gpu_ipc.weights.open(sock, "m")
        assert gc.isenabled()
        r.tensors(Framework)
        assert Framework.enabled == [False] * 4
        assert gc.isenabled()
        with pytest.raises(gpu_ipc.ArgumentTypeError):
            r.tensors(42)  # refused: the collector enabled again all the same
        assert gc.isenabled()
        gc.disable()
        try:
            r.tensors(Framework)
            assert not gc.isenabled()
        finally:
            gc.enable()


def test_stage_of_a_framework_writes_in_place(sock: str) -> None:
    with gpu_ipc.weights.publish(state_dict(1), "m", socket=sock) as pub:
        staged = pub.stage(np)
        for name, a in staged.items():
            assert a.flags.writeable, name
            a[...] = state_dict(7)[name]
        del staged
        assert pub.commit() == 2
        with gpu_ipc.weights.open(sock, "m") as r:
            assert_generation(r.tensors(), 7)


def test_stage_of_a_framework_keeps_each_arenas_tensors(sock: str) -> None:
    """An arena staged again gives the tensors cut at its first use (the same objects, at the same addresses), and
    every generation written through them reads back right, while a reader holds the previous one."""
    with gpu_ipc.weights.publish(state_dict(1), "m", socket=sock, keep=2) as pub:
        with gpu_ipc.weights.open(sock, "m") as r:
            seen: dict[int, dict[str, np.ndarray]] = {}
            for generation in range(2, 9):
                staged = pub.stage(np)
                base = staged["embed.weight"].ctypes.data
                if base in seen:
                    assert all(staged[k] is seen[base][k] for k in staged), "an arena's tensors were cut again"
                seen[base] = staged
                for name, a in staged.items():
                    a[...] = state_dict(generation)[name]
                assert pub.commit() == generation
                assert r.refresh() == generation
                assert_generation(r.tensors(), generation)
            assert 2 <= len(seen) <= 3, f"{len(seen)} arenas for 7 generations, one reader"
            assert pub.stage(np) is not pub.stage(np), "a new dict each time (the caller may change it)"


def test_tensors_of_nineteen_thousand_cost_one_import(sock: str) -> None:
    """A 19,000-tensor dict (the mixture-of-experts count): every tensor cut from the arena reads its own value."""
    sd = {f"layers.{i // 384}.experts.{i % 384}.w": np.full((4, 2), i, dtype=np.int32) for i in range(19_000)}
    with gpu_ipc.weights.publish(sd, "moe", socket=sock):
        with gpu_ipc.weights.open(sock, "moe") as r:
            cut = r.tensors(np)
            assert len(cut) == 19_000
            values = np.array([int(a[1, 1]) for a in cut.values()])
            assert np.array_equal(values, np.arange(19_000))


def test_load_into_copies_in_place_and_checks_shapes(sock: str) -> None:
    with gpu_ipc.weights.publish(state_dict(5), "m", socket=sock) as pub:
        r = gpu_ipc.weights.open(sock, "m")
        target = {k: np.zeros_like(v) for k, v in state_dict(0).items()}
        pointers = {k: v.ctypes.data for k, v in target.items()}
        assert r.load_into(target) == 4
        assert all(np.array_equal(target[k], v) for k, v in state_dict(5).items())
        assert {k: v.ctypes.data for k, v in target.items()} == pointers
        pub.update(state_dict(6))
        r.refresh()
        r.load_into(target)
        assert all(np.array_equal(target[k], v) for k, v in state_dict(6).items())
        wrong = dict(target, step=np.zeros((2,), dtype=np.int64))
        with pytest.raises(gpu_ipc.ArgumentError, match="step"):
            r.load_into(wrong)
        with pytest.raises(gpu_ipc.ArgumentError, match="names differ"):
            r.load_into({"ghost": np.zeros(1)})
        partial = {"step": np.zeros((), dtype=np.int64)}
        assert r.load_into(partial, strict=False) == 1 and int(partial["step"]) == 6


def test_update_refuses_another_layout(sock: str) -> None:
    with gpu_ipc.weights.publish(state_dict(1), "m", socket=sock) as pub:
        with pytest.raises(gpu_ipc.ArgumentError, match="names differ"):
            pub.update({"embed.weight": np.zeros((16, 8), dtype=np.float32)})
        bad = dict(state_dict(2), step=np.zeros((3,), dtype=np.int64))
        with pytest.raises(gpu_ipc.ArgumentError, match="step"):
            pub.update(bad)
        assert pub.generation == 1


def test_bind_is_for_torch_tensors_on_a_gpu_and_what_it_binds_stays_with_its_owner(sock: str) -> None:
    """Publisher.bind() and Reader.bind() read a GPU set's torch tensors once; on the host backend each refuses with
    what it is for, and update() / load_into() refuse what another publisher / reader bound (checked before anything
    is copied)."""
    with gpu_ipc.weights.publish(state_dict(1), "m", socket=sock) as pub:
        with pytest.raises(gpu_ipc.ArgumentError, match="bind\\(\\) is for torch tensors on a GPU"):
            pub.bind(state_dict(2))
        with gpu_ipc.weights.publish(state_dict(1), "other", socket=sock + ".2") as other:
            foreign = gpu_ipc.weights.BoundSources(other, [], [], None)
            with pytest.raises(gpu_ipc.ArgumentError, match="bound by another publisher"):
                pub.update(foreign)
        assert pub.generation == 1
        with gpu_ipc.weights.open(sock, "m") as r:
            with pytest.raises(gpu_ipc.ArgumentError, match="bind\\(\\) is for torch tensors on a GPU"):
                r.bind(state_dict(2))
            with gpu_ipc.weights.open(sock, "m") as other_reader:
                foreign_targets = gpu_ipc.weights.BoundTargets(other_reader, [], [], None)
                with pytest.raises(gpu_ipc.ArgumentError, match="bound by another reader"):
                    r.load_into(foreign_targets)


def test_a_wrong_name_and_no_owner_say_so(sock: str) -> None:
    with pytest.raises(gpu_ipc.NoOwner):
        gpu_ipc.weights.open(sock, "m", timeout=0.5)
    with gpu_ipc.weights.publish(state_dict(1), "llama", socket=sock):
        with pytest.raises(gpu_ipc.NotFound, match="publishes llama"):
            gpu_ipc.weights.open(sock, "mistral")


def test_max_readers_bounds_the_readers_attached_at_once_and_a_reader_waits_its_turn(sock: str) -> None:
    with pytest.raises(gpu_ipc.ArgumentError, match="max_readers: at least 1"):
        gpu_ipc.weights.publish(state_dict(1), "m", socket=sock, max_readers=0)
    with gpu_ipc.weights.publish(state_dict(1), "m", socket=sock, max_readers=2) as pub:
        first, second = gpu_ipc.weights.open(sock, "m"), gpu_ipc.weights.open(sock, "m")
        started = time.monotonic()
        with pytest.raises(gpu_ipc.GpuIpcError, match="at most 2"):
            gpu_ipc.weights.open(sock, "m", timeout=0.5)  # asked again until its timeout, then refused
        assert 0.4 < time.monotonic() - started < 3.0
        # A reader that waits gets in as soon as one leaves.
        threading.Timer(0.3, first.close).start()
        started = time.monotonic()
        with gpu_ipc.weights.open(sock, "m", timeout=5) as third:
            assert 0.2 < time.monotonic() - started < 4.0
            assert_generation(third.tensors(), 1)
        assert len(pub.readers()) <= 2
        second.close()


def test_the_owner_closing_raises_owner_gone_and_held_tensors_stay(sock: str) -> None:
    pub = gpu_ipc.weights.publish(state_dict(1), "m", socket=sock)
    r = gpu_ipc.weights.open(sock, "m")
    tensors = r.tensors()
    pub.close()
    with pytest.raises(gpu_ipc.OwnerGone):
        r.latest()
    with pytest.raises(gpu_ipc.OwnerGone):
        r.wait_for(2, timeout=5)
    assert_generation(tensors, 1)


READER = """
import sys, time, numpy as np, gpu_ipc.weights
r = gpu_ipc.weights.open(sys.argv[1], "m", timeout=10)
mode = sys.argv[2]
t = r.tensors()
print("HELD", r.generation, flush=True)
if mode == "hold":
    sys.stdin.readline()
    assert all(np.all(np.from_dlpack(v) == (r.generation % 127 if k.endswith("proj.weight") else r.generation))
               for k, v in t.items())
    held = r.generation
    r.refresh()
    print("MOVED", held, r.generation, flush=True)
    sys.stdin.readline()
elif mode == "sleep":
    time.sleep(60)
elif mode == "switch":
    switches = mixed = 0
    while r.generation < int(sys.argv[3]):
        before = r.generation
        if r.refresh() != before:
            switches += 1
        g = r.generation
        for k, v in r.tensors().items():
            want = g % 127 if k.endswith("proj.weight") else g
            if not np.all(np.from_dlpack(v) == want):
                mixed += 1
        assert r.verify() == 4
    print("RESULT", switches, mixed, flush=True)
"""

OWNER = """
import sys, time, numpy as np, gpu_ipc.weights
sd = {"w": np.full((64,), 1, dtype=np.float32), "b": np.full((8,), 1, dtype=np.int64)}
pub = gpu_ipc.weights.publish(sd, "m", socket=sys.argv[1])
print("PUBLISHED", pub.generation, flush=True)
time.sleep(60)
"""


def wait_for_readers(pub: gpu_ipc.weights.Publisher, n: int) -> None:
    """Until the owner's door has recorded ``n`` readers (a child says it opened a moment before that)."""
    deadline = time.monotonic() + 10
    while len({pid for pid, _g in pub.readers()}) < n:
        assert time.monotonic() < deadline, pub.readers()
        time.sleep(0.002)


def test_a_reader_process_holds_n_while_the_owner_publishes_n_plus_1_and_n_plus_2(sock: str) -> None:
    with gpu_ipc.weights.publish(state_dict(1), "m", socket=sock) as pub:
        child = spawn(READER, sock, "hold")
        try:
            assert expect(child, "HELD") == ["1"]
            wait_for_readers(pub, 1)
            pub.update(state_dict(2))
            pub.update(state_dict(3))
            assert pub.readers() == [(child.pid, 1)]
            assert pub.arenas() == 3
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
            assert expect(child, "MOVED") == ["1", "3"]
            child.stdin.write("done\n")
            child.stdin.flush()
            assert child.wait(timeout=30) == 0
        finally:
            child.kill()
        deadline = time.monotonic() + 2
        while pub.readers() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pub.readers() == []
        pub.update(state_dict(4))
        assert pub.arenas() == 2


def test_a_reader_killed_releases_its_generation(sock: str) -> None:
    with gpu_ipc.weights.publish(state_dict(1), "m", socket=sock, keep=1, max_arenas=2) as pub:
        child = spawn(READER, sock, "sleep")
        try:
            expect(child, "HELD")
            wait_for_readers(pub, 1)
            pub.update(state_dict(2))
            with pytest.raises(gpu_ipc.PoolFull, match=r"max_arenas.*holds \[1\]") as full:
                pub.update(state_dict(3))  # the reader holds 1, 2 is the newest: no third arena
            assert f"pid {child.pid}" in str(full.value), full.value
            assert pub.readers() == [(child.pid, 1)]
            os.kill(child.pid, signal.SIGKILL)
            killed = time.monotonic()
            child.wait()
            while pub.readers():
                assert time.monotonic() - killed < 1.0, "the dead reader's generation was not released"
                time.sleep(0.005)
            assert pub.update(state_dict(3)) == 3
        finally:
            child.kill()


def test_the_owner_killed_is_seen_within_a_second(sock: str) -> None:
    owner = spawn(OWNER, sock)
    try:
        expect(owner, "PUBLISHED")
        r = gpu_ipc.weights.open(sock, "m")
        tensors = r.tensors()
        os.kill(owner.pid, signal.SIGKILL)
        killed = time.monotonic()
        owner.wait()
        with pytest.raises(gpu_ipc.OwnerGone):
            r.wait_for(2, timeout=5)
        assert time.monotonic() - killed < 1.0
        assert np.all(np.from_dlpack(tensors["w"]) == 1) and np.all(np.from_dlpack(tensors["b"]) == 1)
    finally:
        owner.kill()


def test_a_thousand_switches_show_no_mixed_generation(sock: str) -> None:
    with gpu_ipc.weights.publish(state_dict(1), "m", socket=sock, checksums=True) as pub:
        child = spawn(READER, sock, "switch", "1000")
        try:
            expect(child, "HELD")
            while pub.generation < 1000:
                pub.update(state_dict(pub.generation + 1))
            switches, mixed = expect(child, "RESULT")
            assert child.wait(timeout=60) == 0
        finally:
            child.kill()
        assert int(mixed) == 0 and int(switches) >= 1


def test_a_watched_generation_is_seen_in_the_status_word_and_the_owners_end_releases_it(sock: str) -> None:
    with gpu_ipc.weights.publish(state_dict(1), "m", socket=sock) as pub:
        r = gpu_ipc.weights.open(sock, "m")
        done = r.watch(1)
        assert done.generation == 1 and r.wait_status(done) == ("published", 1)
        word = np.from_dlpack(done)  # the host backend's status word: host memory, no copy
        assert word.shape == () and word.dtype == np.int64 and int(word) == 1
        assert word.ctypes.data == done.status_word
        wait = r.watch(2)
        time.sleep(0.02)
        assert r.wait_status(wait) == ("waiting", 0) and wait.status_of(int(word)) == "waiting"
        pub.update(state_dict(2))
        deadline = time.monotonic() + 1.0
        while r.wait_status(wait)[0] == "waiting":
            assert time.monotonic() < deadline, "the status word did not follow the publication"
            time.sleep(0.0005)
        assert r.wait_status(wait) == ("published", 2) and int(word) == 2
        pending = r.watch(3)
    deadline = time.monotonic() + 1.0  # the owner closed: the pending wait is released as gone
    while r.wait_status(pending)[0] == "waiting":
        assert time.monotonic() < deadline, "the owner's end did not release the wait"
        time.sleep(0.0005)
    assert r.wait_status(pending) == ("gone", 2)
    assert int(word) == gpu_ipc.weights.GenerationWait.GONE_BIT | 2 and pending.status_of(int(word)) == "gone"
    r.close()
    assert int(word) & ~gpu_ipc.weights.GenerationWait.GONE_BIT == 2  # the array keeps the word


def test_stream_waits_refuse_the_host_backend_generation_0_and_a_closed_reader(sock: str) -> None:
    with gpu_ipc.weights.publish(state_dict(1), "m", socket=sock):
        r = gpu_ipc.weights.open(sock, "m")
        with pytest.raises(gpu_ipc.GpuIpcError, match="GPU backend"):
            r.wait_on(2)
        with pytest.raises(gpu_ipc.ArgumentError, match="generations run from 1"):
            r.watch(0)
        with pytest.raises(OverflowError):
            r.watch(-1)
        r.close()
        with pytest.raises(gpu_ipc.GpuIpcError):
            r.watch(2)


@pytest.mark.skipif(cuda_devices() < 1, reason="needs a GPU and torch")
@pytest.mark.parametrize("backend", ["legacy", "vmm"])
def test_a_torch_stream_waits_for_the_next_generation_and_for_the_owners_end(sock: str, backend: str) -> None:
    check_stream_waits(sock, backend)


def test_create_serves_a_layout_and_the_first_generation_is_written_in_the_arena(sock: str) -> None:
    """create(): nothing published until the owner writes the first generation in the arena and commits it."""
    layout = [(name, a.dtype, a.shape) for name, a in state_dict(1).items()]
    with gpu_ipc.weights.create(layout, "m", socket=sock, backend="host") as pub:
        assert pub.generation == 0 and pub.backend == "host"
        with pytest.raises(gpu_ipc.Timeout):
            gpu_ipc.weights.open(sock, "m", timeout=0.2)  # nothing published yet
        staged = pub.stage(np)
        for name, a in staged.items():
            a[...] = state_dict(1)[name]
        assert pub.commit() == 1
        with gpu_ipc.weights.open(sock, "m") as r:
            assert r.generation == 1
            assert_generation(r.tensors(), 1)
        assert pub.update(state_dict(2)) == 2  # then as any set
    # A layout given as arrays (their values unused) makes the same set; the backend follows host arrays.
    with gpu_ipc.weights.create(state_dict(7), "m2", socket=sock + "2") as pub:
        assert pub.backend == "host" and pub.generation == 0
        assert pub.update(state_dict(3)) == 1
        with gpu_ipc.weights.open(sock + "2", "m2") as r:
            assert_generation(r.tensors(), 3)


def test_create_refuses_layouts_that_say_nothing_or_the_wrong_thing(sock: str) -> None:
    with pytest.raises(gpu_ipc.ArgumentError, match="empty"):
        gpu_ipc.weights.create([], "m", socket=sock, backend="host")
    with pytest.raises(gpu_ipc.ArgumentTypeError, match=r"\(name, dtype, shape\)"):
        gpu_ipc.weights.create([("w", "float32")], "m", socket=sock, backend="host")
    with pytest.raises(gpu_ipc.ArgumentTypeError, match="layout"):
        gpu_ipc.weights.create(42, "m", socket=sock, backend="host")
    with pytest.raises(gpu_ipc.ArgumentError, match="negative"):
        gpu_ipc.weights.create([("w", "float32", (4, -1))], "m", socket=sock, backend="host")
    with pytest.raises(gpu_ipc.GpuIpcError, match="quaternion"):
        gpu_ipc.weights.create([("w", "quaternion", (4,))], "m", socket=sock, backend="host")
    # Nothing was left serving: the socket is free for a set that is right.
    with gpu_ipc.weights.create([("w", np.float32, [4])], "m", socket=sock, backend="host") as pub:
        assert pub.generation == 0


@pytest.mark.skipif(cuda_devices() < 1, reason="needs a GPU and torch")
def test_a_meta_model_is_loaded_straight_into_the_arena_and_runs_on_it(sock: str) -> None:
    """The model's shapes from a meta module (no memory), its values written into generation 1's arena, the
    owner's module then aliasing the arena (load_state_dict(assign=True)): one copy of the weights in GPU memory."""
    import torch  # type: ignore[import-not-found, unused-ignore]

    with torch.device("meta"):
        model = torch.nn.Linear(256, 128)
    with gpu_ipc.weights.create(model, "m", socket=sock) as pub:
        assert pub.backend == "vmm" and pub.generation == 0
        staged = pub.stage(torch)
        checkpoint = {"weight": torch.randn(128, 256), "bias": torch.randn(128)}  # as a loader reads it
        for name, t in checkpoint.items():
            staged[name].copy_(t)
        assert pub.commit() == 1
        model.load_state_dict(staged, assign=True)
        assert model.weight.data_ptr() == staged["weight"].data_ptr()  # the module runs on the arena
        x = torch.randn(4, 256, device="cuda")
        expected = x @ checkpoint["weight"].cuda().T + checkpoint["bias"].cuda()
        assert torch.allclose(model(x), expected, atol=1e-4)
        with gpu_ipc.weights.open(sock, "m") as r:
            got = r.tensors(torch)
            assert torch.equal(got["weight"].cpu(), checkpoint["weight"])
            assert torch.equal(got["bias"].cpu(), checkpoint["bias"])
        del staged, got
        model = None  # noqa: F841  (its parameters are the arena's tensors: drop them before close)


def _current_context(cuda: Any) -> int:
    """The calling thread's current CUDA context (0: none), through the driver (ctypes, no other package)."""
    import ctypes

    ctx = ctypes.c_void_p()
    assert cuda.cuCtxGetCurrent(ctypes.byref(ctx)) == 0
    return int(ctx.value or 0)


@pytest.mark.skipif(cuda_devices() < 1, reason="needs a GPU and torch")
@pytest.mark.parametrize("backend", ["legacy", "vmm"])
def test_owner_and_reader_leave_the_callers_current_context_as_they_found_it(sock: str, backend: str) -> None:
    """A caller whose current context is its own (made with cuCtxCreate, not the device's primary one, which the
    library works in) keeps it current through publish, open, tensors, update, verify and close: the library
    enters its context for each call and puts the caller's back (on two GPUs the same rule keeps torch's current
    device). A thread with no context current keeps the one the library made current. The legacy backend cannot
    open a set its own process serves (cuIpcOpenMemHandle opens only another process's memory): refused, saying
    so, and the caller's context still kept."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    dev, own = ctypes.c_int(), ctypes.c_void_p()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuCtxCreate_v2(ctypes.byref(own), 0, dev) == 0  # pushed: current on this thread
    try:
        mine = int(own.value or 0)
        assert mine and _current_context(cuda) == mine
        with gpu_ipc.weights.publish(state_dict(1), "m", socket=sock, backend=backend, device=0,
                                      checksums=True) as pub:
            assert _current_context(cuda) == mine, "publish"
            assert pub.update(state_dict(2)) == 2
            assert _current_context(cuda) == mine, "update"
            if backend == "legacy":
                with pytest.raises(gpu_ipc.BackendError, match="this same process"):
                    gpu_ipc.weights.open(sock, "m")
                assert _current_context(cuda) == mine, "a refused open"
            else:
                with gpu_ipc.weights.open(sock, "m") as r:
                    assert _current_context(cuda) == mine, "open"
                    assert r.generation == 2 and len(r.tensors()) == len(state_dict(2))
                    assert _current_context(cuda) == mine, "tensors"
                    assert r.verify() == len(state_dict(2))  # checksums read back from the arena on the GPU
                    assert _current_context(cuda) == mine, "verify"
                    assert pub.update(state_dict(3)) == 3 and r.refresh() == 3
                    assert _current_context(cuda) == mine, "refresh"

                seen: list[int] = []

                def fresh_thread() -> None:
                    with gpu_ipc.weights.open(sock, "m") as other:
                        assert other.generation == 3
                    seen.append(_current_context(cuda))

                t = threading.Thread(target=fresh_thread)
                t.start()
                t.join(30)
                assert seen and seen[0] not in (0, mine), "a thread with none keeps the library's (the primary)"
        assert _current_context(cuda) == mine, "close"
    finally:
        assert cuda.cuCtxDestroy_v2(own) == 0
