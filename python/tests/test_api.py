"""The Python API on the host backend: views without a copy, errors that mirror the core's, and every misuse."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from conftest import HEIGHT, WIDTH, host_pair, pattern, publish_pattern

import gpu_ipc


def test_numpy_views_share_the_ring_memory(sock: str) -> None:
    producer, consumer = host_pair(sock)
    slot = producer.acquire()
    assert slot.shape == (HEIGHT, WIDTH, 3) and slot.dtype == "uint8" and slot.nbytes == WIDTH * HEIGHT * 3
    assert slot.__dlpack_device__() == (1, 0)  # kDLCPU
    written = np.from_dlpack(slot)
    assert written.ctypes.data == slot.ptr  # no copy: the slot itself
    written[:] = 42
    written[1, 2] = (1, 2, 3)
    producer.publish(slot)

    frame = consumer.next_frame()
    view = np.from_dlpack(frame)
    assert view.ctypes.data == frame.ptr  # no copy: the frame in place
    assert view.shape == (HEIGHT, WIDTH, 3) and view.dtype == np.uint8
    assert view[0, 0, 0] == 42 and tuple(view[1, 2]) == (1, 2, 3)
    copied = np.from_dlpack(frame, copy=True)
    assert copied.ctypes.data != frame.ptr and np.array_equal(copied, view)
    assert not hasattr(frame, "__cuda_array_interface__")  # host memory: DLPack only
    consumer.release(frame)
    producer.close()
    consumer.close()


def test_frame_context_manager_releases_and_iteration_ends_cleanly(sock: str) -> None:
    producer, consumer = host_pair(sock, slots=2)
    publish_pattern(producer)
    publish_pattern(producer)
    with consumer.next_frame() as frame:
        assert frame.seq == 0 and not frame.released
        assert np.array_equal(np.from_dlpack(frame).reshape(-1), pattern(0, frame.nbytes))
    assert frame.released
    publish_pattern(producer)  # frame 2 reuses frame 0's slot: released by the `with`

    def rest() -> None:
        publish_pattern(producer)  # frame 3 needs frame 1 released: iteration releases it when asked for frame 2
        publish_pattern(producer)
        producer.close()  # the end of the stream after frame 4

    t = threading.Thread(target=rest)
    t.start()
    seqs = []
    for f in consumer:
        assert np.array_equal(np.from_dlpack(f).reshape(-1), pattern(f.seq, f.nbytes))
        seqs.append(f.seq)
    t.join(10)
    assert seqs == [1, 2, 3, 4]
    assert consumer.next_sequence == 5
    with pytest.raises(gpu_ipc.EndOfStream) as info:
        consumer.next_frame()
    assert info.value.published == 5 and info.value.past_end is None
    assert str(info.value) == "end of stream: the producer closed the ring after 5 frames"
    consumer.close()


def test_release_twice_and_use_after_release(sock: str) -> None:
    producer, consumer = host_pair(sock)
    publish_pattern(producer)
    frame = consumer.next_frame()
    consumer.release(frame)
    with pytest.raises(gpu_ipc.ReleasedError, match="released already"):
        consumer.release(frame)
    with pytest.raises(gpu_ipc.ReleasedError):
        frame.release()
    for use in (lambda: frame.ptr, frame.__dlpack__, frame.__dlpack_device__, lambda: np.from_dlpack(frame)):
        with pytest.raises(gpu_ipc.ReleasedError, match="slot is the producer's again"):
            use()
    assert frame.seq == 0 and frame.released  # plain facts stay readable
    slot = producer.acquire()
    producer.publish(slot)
    with pytest.raises(gpu_ipc.ReleasedError, match="published already"):
        producer.publish(slot)
    with pytest.raises(gpu_ipc.ReleasedError):
        np.from_dlpack(slot)
    producer.close()
    consumer.close()


def test_use_after_close(sock: str) -> None:
    producer, consumer = host_pair(sock)
    publish_pattern(producer)
    frame = consumer.next_frame()
    array = np.from_dlpack(frame)
    consumer.close()
    consumer.close()  # idempotent
    assert consumer.closed
    with pytest.raises(gpu_ipc.ClosedError, match="closed"):
        consumer.next_frame()
    with pytest.raises(gpu_ipc.ClosedError):
        consumer.release(frame)
    with pytest.raises(gpu_ipc.ReleasedError, match="consumer is closed"):
        _ = frame.ptr
    # The array made before still reads mapped memory (the capsule keeps the host mapping): no crash.
    assert array.shape == (HEIGHT, WIDTH, 3)
    int(array.sum())
    producer.close()
    with pytest.raises(gpu_ipc.ClosedError):
        producer.acquire()
    with pytest.raises(gpu_ipc.ClosedError):
        producer.drain()


def test_a_slot_array_outlives_its_producer(sock: str) -> None:
    producer, consumer = host_pair(sock)
    slot = producer.acquire()
    array = np.from_dlpack(slot)
    array[:] = 9
    consumer.close()
    producer.close()
    with pytest.raises(gpu_ipc.ClosedError, match="producer is closed"):
        _ = slot.ptr
    # The capsule keeps the ring's memory: the array still reads (and writes) mapped memory.
    array[0, 0] = (1, 2, 3)
    assert int(array[1:].sum()) == 9 * array[1:].size and tuple(array[0, 0]) == (1, 2, 3)


def test_several_slots_held_at_once_go_out_in_order(sock: str) -> None:
    """acquire_after: three frames held at once, written last first, published in order; the consumer reads each
    intact. Out of order, every slot held, another producer's slot, a published one: refused, nothing lost."""
    producer, consumer = host_pair(sock, slots=4)
    first = producer.acquire()
    second = producer.acquire_after(first)
    third = producer.acquire_after(second)
    assert (second.seq, third.seq) == (first.seq + 1, first.seq + 2)
    assert len({first.slot, second.slot, third.slot}) == 3
    for slot in (third, first, second):
        np.from_dlpack(slot).reshape(-1)[:] = pattern(slot.seq, slot.nbytes)
    with pytest.raises(gpu_ipc.ForeignToken, match="publish the frames in order"):
        producer.publish(second)  # refused before anything is taken: it goes out in its turn below
    assert not second.published
    fourth = producer.acquire_after(third)
    with pytest.raises(gpu_ipc.ConfigError, match="holds unpublished"):
        producer.acquire_after(fourth)  # frame 4 would take frame 0's slot
    np.from_dlpack(fourth).reshape(-1)[:] = pattern(fourth.seq, fourth.nbytes)
    for slot in (first, second, third, fourth):
        producer.publish(slot)
    with pytest.raises(gpu_ipc.ReleasedError):
        producer.acquire_after(first)
    for seq in range(4):
        frame = consumer.next_frame(timeout=5)
        assert frame.seq == seq
        assert np.array_equal(np.from_dlpack(frame).reshape(-1), pattern(seq, frame.nbytes))
        consumer.release(frame)
    other, other_consumer = host_pair(sock + "2")
    theirs = other.acquire()
    with pytest.raises(gpu_ipc.ForeignToken):
        producer.acquire_after(theirs)
    other.publish(theirs)
    for p in (producer, other):
        p.close()
    for c in (consumer, other_consumer):
        c.close()


def test_foreign_frames_and_slots_are_refused(sock: str) -> None:
    producer, consumer = host_pair(sock)
    other_sock = sock + "2"
    other_producer, other_consumer = host_pair(other_sock)
    publish_pattern(producer)
    frame = consumer.next_frame()
    with pytest.raises(gpu_ipc.ForeignToken):
        other_consumer.release(frame)
    assert not frame.released  # refused before anything was taken
    consumer.release(frame)
    slot = producer.acquire()
    with pytest.raises(gpu_ipc.ForeignToken):
        other_producer.publish(slot)
    producer.publish(slot)
    for p in (producer, other_producer):
        p.close()
    for c in (consumer, other_consumer):
        c.close()


def test_next_frame_from_another_thread_while_the_producer_publishes(sock: str) -> None:
    producer, consumer = host_pair(sock)
    got: list[int] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            for _ in range(20):
                frame = consumer.next_frame(timeout=5)  # blocks with the GIL released
                got.append(frame.seq)
                consumer.release(frame)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=read)
    t.start()
    time.sleep(0.1)  # the reader is waiting: the main thread still runs
    for _ in range(20):
        publish_pattern(producer)
    t.join(10)
    assert errors == [] and got == list(range(20))
    producer.close()
    consumer.close()


def test_ctrl_c_interrupts_a_wait(sock: str) -> None:
    producer, consumer = host_pair(sock)
    main = threading.main_thread().ident
    assert main is not None
    timer = threading.Timer(0.3, signal.pthread_kill, args=(main, signal.SIGINT))
    timer.start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        consumer.next_frame(timeout=30)  # nothing is published
    assert time.monotonic() - start < 2
    # The consumer is still usable after the interrupt.
    publish_pattern(producer)
    with consumer.next_frame(timeout=5) as frame:
        assert frame.seq == 0
    # And the producer's waits too: both slots held, acquire waits.
    publish_pattern(producer)
    held = consumer.next_frame()
    publish_pattern(producer)
    timer = threading.Timer(0.3, signal.pthread_kill, args=(main, signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        producer.acquire(timeout=30)
    consumer.release(held)
    producer.close()
    consumer.close()


def test_timeout_mirrors_the_core(sock: str) -> None:
    producer, consumer = host_pair(sock)
    start = time.monotonic()
    with pytest.raises(gpu_ipc.Timeout) as info:
        consumer.next_frame(timeout=0.2)
    assert 0.15 < time.monotonic() - start < 2
    assert isinstance(info.value, gpu_ipc.GpuIpcError)
    assert info.value.waited >= 0.2 and "frame" in info.value.what
    assert str(info.value).startswith("timed out after")
    producer.close()
    consumer.close()


def test_fork_child_gets_an_error_not_a_crash(sock: str) -> None:
    producer, consumer = host_pair(sock)
    publish_pattern(producer)
    pid = os.fork()
    if pid == 0:  # the child: the parent's objects refuse, and dropping them leaves the parent's ring alone
        code = 1
        try:
            consumer.next_frame(timeout=0.1)
        except gpu_ipc.GpuIpcError as e:
            code = 0 if "fork" in str(e) else 2
        try:
            producer.acquire(timeout=0.1)
            code = 3
        except gpu_ipc.GpuIpcError:
            pass
        del consumer, producer
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's ring still works.
    with consumer.next_frame(timeout=5) as frame:
        assert frame.seq == 0
    publish_pattern(producer)
    with consumer.next_frame(timeout=5) as frame:
        assert frame.seq == 1
    producer.close()
    consumer.close()


def test_errors_name_the_fix() -> None:
    with pytest.raises(gpu_ipc.NoProducer, match="start the producer first"):
        gpu_ipc.Consumer("/tmp/gi-no-such-dir/f.sock", backend="host")
    with pytest.raises(gpu_ipc.StrategyUnavailable):
        gpu_ipc.Producer("/tmp/gi-unused.sock", backend="host", sync="gpu-stream-ops")
    with pytest.raises(ValueError, match="sync strategy"):
        gpu_ipc.Producer("/tmp/gi-unused.sock", backend="host", sync="warp-drive")
    with pytest.raises(ValueError, match="backend"):
        gpu_ipc.Consumer("/tmp/gi-unused.sock", backend="opengl")
    with pytest.raises(ValueError, match="pixel format"):
        gpu_ipc.Producer("/tmp/gi-unused.sock", backend="host", format="yuv420")


def test_gpu_backend_without_a_driver_says_so() -> None:
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("this machine has an NVIDIA GPU")
    with pytest.raises(gpu_ipc.NoDriver, match="no CUDA driver"):
        gpu_ipc.Producer("/tmp/gi-unused.sock", backend="vmm")
    with pytest.raises(gpu_ipc.DriverError):
        gpu_ipc.Consumer("/tmp/gi-unused.sock", backend="legacy")


def test_wait_for_producer_waits(sock: str) -> None:
    made: list[gpu_ipc.Producer] = []

    def late_producer() -> None:
        time.sleep(0.3)
        producer = gpu_ipc.Producer(sock, width=WIDTH, height=HEIGHT, backend="host")
        made.append(producer)
        producer.wait_for_consumers(1, timeout=10)

    t = threading.Thread(target=late_producer)
    t.start()
    consumer = gpu_ipc.Consumer(sock, backend="host", wait_for_producer=10)
    t.join(10)
    assert consumer.shape == (HEIGHT, WIDTH, 3) and consumer.backend == "host"
    consumer.close()
    made[0].close()


def test_stream_arguments_are_parsed(sock: str) -> None:
    producer, consumer = host_pair(sock)

    class CudaCoreStream:
        def __cuda_stream__(self) -> tuple[int, int]:
            return (0, 0)

    # The host backend ignores streams, but each form is accepted; a non-stream is a TypeError.
    slot = producer.acquire(stream=CudaCoreStream())
    producer.publish(slot, stream=0)
    with pytest.raises(TypeError, match="stream"):
        producer.acquire(stream="default")
    with consumer.next_frame(stream=None) as frame:
        assert frame.stream is None  # host: no stream
        # A CPU strategy hands out only published frames: no stamp to check on a device (the host word, below).
        assert frame.stamp_ptr is None and frame.stamp_expected == frame.seq + 1
    assert gpu_ipc.STAMP_MASK == 2**62 - 1
    producer.close()
    consumer.close()


def test_ctrl_c_interrupts_waiting_for_a_producer_or_consumers(sock: str) -> None:
    main = threading.main_thread().ident
    assert main is not None
    threading.Timer(0.3, signal.pthread_kill, args=(main, signal.SIGINT)).start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        gpu_ipc.Consumer(sock, backend="host", wait_for_producer=30)  # no producer comes
    assert time.monotonic() - start < 2
    producer = gpu_ipc.Producer(sock, width=WIDTH, height=HEIGHT, backend="host")
    threading.Timer(0.3, signal.pthread_kill, args=(main, signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        producer.wait_for_consumers(1, timeout=30)  # no consumer comes
    assert time.monotonic() - start < 4
    producer.close()


def test_the_strategies_describe_themselves_once_and_there_is_one_default() -> None:
    strategies = gpu_ipc.sync_strategies()
    assert [s["name"] for s in strategies] == ["cpu-spin", "cpu-sleep", "ipc-event", "gpu-stream-ops", "gpu-poll"]
    assert [s["name"] for s in strategies if s["waits"] == "gpu"] == ["gpu-stream-ops", "gpu-poll"]
    assert [s["name"] for s in strategies if s["needs_mps"]] == ["gpu-poll"]
    assert [s["name"] for s in strategies if s["default"]] == ["gpu-stream-ops"]
    assert gpu_ipc.default_sync("vmm") == gpu_ipc.default_sync("legacy") == "gpu-stream-ops"
    assert gpu_ipc.default_sync("host") == "cpu-spin"
    with pytest.raises(gpu_ipc.ArgumentError):
        gpu_ipc.default_sync("cuda")


def test_the_bridge_asks_the_descriptor_for_its_cpu_strategies_and_its_default() -> None:
    from gpu_ipc import bridge

    assert bridge.CPU_STRATEGIES == ("cpu-spin", "cpu-sleep", "ipc-event")
    assert bridge._default_sync("vmm") == "ipc-event"
    assert bridge._default_sync("host") == "cpu-spin"
