"""`Frame.array(library)` and `Stamp.array(library)`: the slot's array, made once per library and handed out again as
a new alias for every frame of the slot. On the host backend (NumPy) these tests read the ring's own memory: they
fail if a frame's array holds any other frame's bytes while the frame is held, if a cached array outlives the
consumer's mapping, or if what one frame's caller does to its array object reaches the next frame of the slot."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import HEIGHT, WIDTH, host_pair, pattern, publish_pattern

import gpu_ipc


def frame_bytes(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1)


def test_every_frame_gets_its_own_bytes_lap_after_lap(sock: str) -> None:
    slots = 3
    producer, consumer = host_pair(sock, slots=slots)
    seen: dict[int, np.ndarray] = {}
    for seq in range(5 * slots):  # five laps of the ring: every slot's cached array is handed out four more times
        assert publish_pattern(producer) == seq
        with consumer.next_frame(timeout=5) as frame:
            image = frame.array("numpy")
            assert isinstance(image, np.ndarray)
            assert image.shape == (HEIGHT, WIDTH, 3) == frame.shape and image.dtype == np.uint8
            assert image.ctypes.data == frame.ptr  # the frame in place, no copy
            assert np.array_equal(frame_bytes(image), pattern(seq, frame.nbytes)), f"frame {seq}"
            earlier = seen.get(frame.slot)
            if earlier is not None:
                # A new array object for every frame, over the same memory as the slot's earlier ones.
                assert image is not earlier and np.shares_memory(image, earlier)
            seen[frame.slot] = image
    producer.close()
    consumer.close()


def test_a_frame_never_shows_the_bytes_of_the_slots_earlier_frame(sock: str) -> None:
    producer, consumer = host_pair(sock, slots=2)
    for _ in range(2):
        publish_pattern(producer)
    first = consumer.next_frame(timeout=5)
    kept = first.array("numpy")  # slot 0, frame 0: the slot's array is made here
    assert np.array_equal(frame_bytes(kept), pattern(0, first.nbytes))
    consumer.release(first)
    assert publish_pattern(producer) == 2  # frame 2 goes into slot 0, over frame 0
    with consumer.next_frame(timeout=5) as second:
        assert second.seq == 1
    with consumer.next_frame(timeout=5) as third:
        assert (third.seq, third.slot) == (2, 0)
        image = third.array("numpy")
        assert np.array_equal(frame_bytes(image), pattern(2, third.nbytes))
    # As documented: an array kept past its frame's release shows what the producer wrote into the slot since.
    assert np.array_equal(frame_bytes(kept), pattern(2, third.nbytes))
    producer.close()
    consumer.close()


def test_what_a_caller_does_to_its_array_object_stays_with_that_frame(sock: str) -> None:
    producer, consumer = host_pair(sock, slots=1)
    publish_pattern(producer)
    with consumer.next_frame(timeout=5) as frame:
        image = frame.array("numpy")
        image.shape = (-1,)  # in place, on this array object only
        image.flags.writeable = False
    publish_pattern(producer)
    with consumer.next_frame(timeout=5) as frame:
        image = frame.array("numpy")
        assert image.shape == (HEIGHT, WIDTH, 3) and image.flags.writeable
        assert np.array_equal(frame_bytes(image), pattern(1, frame.nbytes))
    producer.close()
    consumer.close()


def test_array_after_release_or_close_raises_and_handed_out_arrays_stay_mapped(sock: str) -> None:
    producer, consumer = host_pair(sock, slots=2)
    for _ in range(2):
        publish_pattern(producer)
    frame = consumer.next_frame(timeout=5)
    image = frame.array("numpy")
    consumer.release(frame)
    with pytest.raises(gpu_ipc.ReleasedError, match="released"):
        frame.array("numpy")
    held = consumer.next_frame(timeout=5)
    held_image = held.array("numpy")
    stamp = held.stamp
    consumer.close()
    with pytest.raises(gpu_ipc.ReleasedError, match="closed"):
        held.array("numpy")
    with pytest.raises(gpu_ipc.ReleasedError):
        stamp.array("numpy")
    producer.close()
    # Both ends closed: the arrays handed out still hold the mapping, and read the slots' last contents.
    assert np.array_equal(frame_bytes(held_image), pattern(1, held.nbytes))
    assert np.array_equal(frame_bytes(image), pattern(0, held.nbytes))


def test_array_names_the_libraries_it_offers(sock: str) -> None:
    producer, consumer = host_pair(sock, slots=1)
    publish_pattern(producer)
    with consumer.next_frame(timeout=5) as frame:
        with pytest.raises(gpu_ipc.ArgumentError, match="jax.dlpack.from_dlpack"):
            frame.array("jax")
        with pytest.raises(ValueError, match="torch"):
            frame.array("tensorflow")
        with pytest.raises(gpu_ipc.ArgumentError):
            frame.stamp.array("jax")
    producer.close()
    consumer.close()


def test_stamp_array_is_the_slots_word(sock: str) -> None:
    producer, consumer = host_pair(sock, slots=2)
    for _ in range(2):
        publish_pattern(producer)
    frame = consumer.next_frame(timeout=5)
    word = frame.stamp.array("numpy")
    assert isinstance(word, np.ndarray) and word.shape == () and word.dtype == np.int64
    assert word.ctypes.data == frame.stamp.ptr == np.from_dlpack(frame.stamp).ctypes.data
    expected = frame.stamp_expected
    assert bool((word & gpu_ipc.STAMP_MASK) == expected)
    consumer.release(frame)
    assert publish_pattern(producer) == 2  # frame 2 goes into the slot: the word the kept array reads is its stamp
    assert int(word) == 3 and not bool((word & gpu_ipc.STAMP_MASK) == expected)
    with consumer.next_frame(timeout=5) as frame:
        assert frame.seq == 1 and bool((frame.stamp.array("numpy") & gpu_ipc.STAMP_MASK) == frame.stamp_expected)
    with consumer.next_frame(timeout=5) as frame:
        again = frame.stamp.array("numpy")
        assert frame.seq == 2 and again is not word and again.ctypes.data == word.ctypes.data
        assert bool((again & gpu_ipc.STAMP_MASK) == frame.stamp_expected)
    producer.close()
    consumer.close()


def test_iteration_with_arrays_reads_every_frame(sock: str) -> None:
    slots, total = 4, 40
    producer, consumer = host_pair(sock, slots=slots)
    published = 0
    for _ in range(slots):
        publish_pattern(producer)
        published += 1
    checked = []
    for frame in consumer:
        image = frame.array("numpy")
        assert np.array_equal(frame_bytes(image), pattern(frame.seq, frame.nbytes)), f"frame {frame.seq}"
        checked.append(frame.seq)
        if frame.seq == total - 1:
            break
        if frame.seq >= 1 and published < total:  # iteration released the frame before: its slot takes the next
            publish_pattern(producer)
            published += 1
    assert checked == list(range(total))
    producer.close()
    consumer.close()


def test_a_forked_child_cannot_release_the_parents_frame(sock: str) -> None:
    producer, consumer = host_pair(sock, slots=2)
    publish_pattern(producer)
    frame = consumer.next_frame(timeout=5)
    image = frame.array("numpy")
    pid = os.fork()
    if pid == 0:  # the child: the fork guard (a process id read once, again after fork) refuses the release
        code = 1
        try:
            consumer.release(frame)
        except gpu_ipc.GpuIpcError as e:
            code = 0 if "fork" in str(e) else 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not frame.released
    assert np.array_equal(frame_bytes(image), pattern(0, frame.nbytes))
    consumer.release(frame)
    producer.close()
    consumer.close()
