"""`Frame.stamp`: the frame's stamp word as a 0-d array, the check a torch / CuPy / NumPy consumer makes without a
host sync, `(view & STAMP_MASK) == frame.stamp_expected`. On the host backend the view is the word itself in the
ring's control block: these tests fail if a frame whose word does not hold its stamp is judged valid."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import host_pair, publish_pattern

import gpu_ipc

POISON = 1 << 62  # the bit above STAMP_MASK: what a survivor writes for a dead producer (docs/ring.md)


def judged_valid(word: np.ndarray, expected: int) -> bool:
    """The documented idiom, as a NumPy consumer writes it."""
    return bool((word & gpu_ipc.STAMP_MASK) == expected)


def test_a_published_frame_has_its_stamp(sock: str) -> None:
    producer, consumer = host_pair(sock, slots=2)
    publish_pattern(producer)
    publish_pattern(producer)
    for seq in (0, 1):
        with consumer.next_frame() as frame:
            stamp = frame.stamp
            assert isinstance(stamp, gpu_ipc.Stamp) and stamp.expected == frame.stamp_expected == seq + 1
            assert stamp.shape == () and stamp.dtype == "int64" and stamp.__dlpack_device__() == (1, 0)
            word = np.from_dlpack(stamp)
            assert word.shape == () and word.dtype == np.int64
            assert word.ctypes.data == stamp.ptr  # no copy: the word in the control block
            assert judged_valid(word, frame.stamp_expected)
            assert not hasattr(stamp, "__cuda_array_interface__")  # host memory: DLPack only
    producer.close()
    consumer.close()


def test_a_frame_whose_slot_carries_a_later_frame_is_not_valid(sock: str) -> None:
    producer, consumer = host_pair(sock, slots=2)
    publish_pattern(producer)
    publish_pattern(producer)
    frame = consumer.next_frame()
    word = np.from_dlpack(frame.stamp)  # kept past the release: it reads the live word, never a copy
    expected = frame.stamp_expected
    assert judged_valid(word, expected)
    consumer.release(frame)
    assert publish_pattern(producer) == 2  # frame 2 goes into frame 0's slot
    assert int(word) == 3  # frame 2's stamp
    assert not judged_valid(word, expected)
    producer.close()
    consumer.close()


def test_a_word_that_does_not_hold_the_stamp_is_not_valid(sock: str) -> None:
    producer, consumer = host_pair(sock, slots=2)
    publish_pattern(producer)
    frame = consumer.next_frame()
    word = np.from_dlpack(frame.stamp)
    before = int(word)
    try:
        # A dead producer's poison over a frame it never wrote, and a slot a lap behind or ahead.
        for forged, valid in ((POISON, False), (POISON | before, True), (before - 1, False), (before + 2, False)):
            word[...] = forged
            assert judged_valid(word, frame.stamp_expected) is valid, hex(forged)
    finally:
        word[...] = before
    consumer.release(frame)
    producer.close()
    consumer.close()


def test_stamp_after_release_or_close_raises(sock: str) -> None:
    producer, consumer = host_pair(sock, slots=2)
    publish_pattern(producer)
    publish_pattern(producer)
    frame = consumer.next_frame()
    stamp = frame.stamp
    consumer.release(frame)
    with pytest.raises(gpu_ipc.ReleasedError):
        _ = frame.stamp
    with pytest.raises(gpu_ipc.ReleasedError):
        np.from_dlpack(stamp)
    held = consumer.next_frame()
    consumer.close()
    with pytest.raises(gpu_ipc.ReleasedError):
        _ = held.stamp
    producer.close()
