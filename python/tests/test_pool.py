"""Named buffers between processes (gpu_ipc.share / gpu_ipc.open, SharedPool, PoolImporter) on the host backend."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref

import numpy as np
import pytest

import gpu_ipc


def test_alloc_open_read_in_place(sock: str) -> None:
    with gpu_ipc.SharedPool(sock, backend="host", capacity=1 << 20) as pool:
        weights = pool.alloc("weights/layer0", (4, 8), dtype="float32")
        assert weights.shape == (4, 8) and weights.dtype == "float32" and weights.nbytes == 128
        assert weights.source is None and not weights.freed
        written = np.from_dlpack(weights)
        written[:] = np.arange(32, dtype=np.float32).reshape(4, 8)

        view = gpu_ipc.open(sock, "weights/layer0")
        assert view.name == "weights/layer0" and view.generation == weights.generation
        assert view.shape == (4, 8) and view.dtype == "float32" and view.nbytes == 128
        read = np.from_dlpack(view)
        assert read.ctypes.data == view.ptr  # no copy: the pool's memory mapped here
        assert np.array_equal(read, np.arange(32, dtype=np.float32).reshape(4, 8))
        written[0, 0] = 99  # one memory: the importer sees the owner's write
        assert read[0, 0] == 99
        assert gpu_ipc.open(sock, "weights/layer0").ptr == view.ptr  # one attach per socket in this process
        view.check_current()
        weights.free()
        with pytest.raises(gpu_ipc.NotFound, match="no buffer named `weights/layer0`") as missing:
            gpu_ipc.open(sock, "weights/layer0")
        assert missing.value.name == "weights/layer0"
        with pytest.raises(gpu_ipc.StaleBuffer) as stale:
            view.check_current()
        assert stale.value.name == "weights/layer0" and stale.value.held_generation == view.generation
        assert stale.value.current is None
        assert read[0, 0] == 99  # the view still pins the bytes
        with pytest.raises(gpu_ipc.ReleasedError, match="freed already"):
            weights.free()


def test_share_existing_memory_in_place(sock: str) -> None:
    # On the host backend, memory another allocator made means memory the host backend allocated: a buffer of
    # another pool here (on a GPU: a PyTorch tensor; see scripts/python_gpu.py).
    with gpu_ipc.SharedPool(sock + "a", backend="host", capacity=1 << 20) as other:
        block = other.alloc("block", (256,), dtype="uint8")
        source = np.from_dlpack(block)[64:192]  # a slice inside that allocation
        source[:] = np.arange(128, dtype=np.uint8)
        assert gpu_ipc.sharing_backend(source) == "host"
        with gpu_ipc.share(source, "slice", socket=sock) as shared:
            assert shared.source is source and shared.shape == (128,) and shared.dtype == "uint8"
            with pytest.raises(TypeError, match="use the object you shared"):
                np.from_dlpack(shared)
            view = gpu_ipc.open(sock, "slice")
            assert np.array_equal(np.from_dlpack(view), np.arange(128, dtype=np.uint8))
            with pytest.raises(gpu_ipc.NameTaken):
                gpu_ipc.share(source, "slice", socket=sock)
        # Freed while this process's importer views it: not found any more, but the object is still held.
        assert shared.freed and shared.source is source
        with pytest.raises(gpu_ipc.NotFound):
            gpu_ipc.open(sock, "slice")
        view.release()
        assert shared.source is None  # let go once nobody views it


def test_a_freed_shared_object_is_held_while_an_importer_views_it_and_let_go_after(sock: str) -> None:
    with gpu_ipc.SharedPool(sock + "a", backend="host", capacity=1 << 20) as other, \
            gpu_ipc.SharedPool(sock, backend="host") as pool:
        block = other.alloc("block", (256,), dtype="uint8")
        source = np.from_dlpack(block)[:128]
        source[:] = 42
        alive = weakref.ref(source)
        shared = pool.share(source, "t")
        del source
        importer = gpu_ipc.PoolImporter(sock)
        view = importer.lookup("t")
        read = np.from_dlpack(view)  # a tensor made from the view pins too
        shared.free()
        with pytest.raises(gpu_ipc.NotFound):
            importer.lookup("t")  # new lookups are refused at once
        assert "t" not in importer.names()
        for _ in range(3):  # however often the owner polls, the object stays the pool's while it is viewed
            assert pool.reclaim() == 0
            gc.collect()
            assert alive() is not None and shared.source is alive()
        view.release()
        assert pool.reclaim() == 0 and alive() is not None  # the array made from the view still pins it
        assert (read == 42).all()
        del read
        assert pool.reclaim() == 1
        gc.collect()
        assert alive() is None and shared.source is None  # given back to its allocator
        importer.close()


def test_closing_the_pool_lets_go_of_what_nobody_views_and_keeps_what_importers_view(sock: str) -> None:
    with gpu_ipc.SharedPool(sock + "a", backend="host", capacity=1 << 20) as other:
        whole = np.from_dlpack(other.alloc("block", (512,), dtype="uint8"))
        viewed, idle = whole[:256], whole[256:]
        viewed_alive, idle_alive = weakref.ref(viewed), weakref.ref(idle)
        pool = gpu_ipc.SharedPool(sock, backend="host")
        pool.share(viewed, "viewed")
        pool.share(idle, "idle")
        del viewed, idle
        importer = gpu_ipc.PoolImporter(sock)
        view = importer.lookup("viewed")
        pool.close()
        gc.collect()
        assert idle_alive() is None  # nobody viewed it: given back at close
        assert viewed_alive() is not None  # an importer still reads it: kept, never handed to another tensor
        view.release()
        importer.close()


def test_tensors_made_from_a_freed_buffer_keep_its_bytes_from_reuse(sock: str) -> None:
    with gpu_ipc.SharedPool(sock, backend="host", capacity=4096) as pool:
        first = pool.alloc("a", (4096,), dtype="uint8")
        kept = np.from_dlpack(first)
        kept[:] = 7
        first.free()
        with pytest.raises(gpu_ipc.ReleasedError, match="was freed"):
            np.from_dlpack(first)
        with pytest.raises(gpu_ipc.PoolFull, match="bytes of freed buffers wait for"):
            pool.alloc("b", (4096,), dtype="uint8")  # the one block is still the freed buffer's
        assert (kept == 7).all()
        del kept
        assert pool.reclaim() == 1
        second = pool.alloc("b", (4096,), dtype="uint8")
        np.from_dlpack(second)[:] = 1
        second.free()


def test_memory_that_cannot_be_shared_says_why(sock: str) -> None:
    private = np.zeros(16, dtype=np.uint8)  # malloc'd by NumPy: no other process can map it
    with pytest.raises(gpu_ipc.BackendError, match="shares only memory a host pool allocated"):
        gpu_ipc.share(private, "private", socket=sock)
    with pytest.raises(TypeError, match="__cuda_array_interface__"):
        gpu_ipc.share(b"bytes", "bytes", socket=sock)
    with pytest.raises(gpu_ipc.NoOwner, match="start the process that creates the pool first"):
        gpu_ipc.open(sock + "-nobody", "x")


def test_another_process_reads_the_buffer(sock: str) -> None:
    with gpu_ipc.SharedPool(sock, backend="host", capacity=1 << 20) as pool:
        buffer = pool.alloc("counts", (1000,), dtype="int64")
        np.from_dlpack(buffer)[:] = np.arange(1000)
        code = (
            "import numpy as np, gpu_ipc\n"
            f"view = gpu_ipc.open({sock!r}, 'counts')\n"
            "a = np.from_dlpack(view)\n"
            "print(a.dtype, a.shape, int(a.sum()))\n"
            "a[0] = -7\n"  # writes go to the owner's memory
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["int64", "(1000,)", str(sum(range(1000)))]
        assert np.from_dlpack(buffer)[0] == -7


def test_views_outlive_the_owner_and_release(sock: str) -> None:
    pool = gpu_ipc.SharedPool(sock, backend="host", capacity=1 << 20)
    np.from_dlpack(pool.alloc("b", (8,), dtype="uint8"))[:] = 5
    importer = gpu_ipc.PoolImporter(sock)
    assert importer.backend == "host" and importer.names() == ["b"]  # the backend asked of the owner
    view = importer.lookup("b")
    array = np.from_dlpack(view)
    pool.close()
    assert importer.owner_gone
    with pytest.raises(gpu_ipc.OwnerGone, match="attach to a new owner"):
        importer.lookup("b")
    assert list(array) == [5] * 8  # views held stay valid
    view.release()
    view.release()  # idempotent
    with pytest.raises(gpu_ipc.ReleasedError):
        _ = view.ptr
    with pytest.raises(gpu_ipc.ReleasedError):
        np.from_dlpack(view)
    assert list(array) == [5] * 8  # the array keeps its own pin
    importer.close()
    with pytest.raises(gpu_ipc.ClosedError):
        importer.lookup("b")


def test_bad_requests(sock: str) -> None:
    with gpu_ipc.SharedPool(sock, backend="host", capacity=4096) as pool:
        with pytest.raises(ValueError, match="element type"):
            pool.alloc("x", (4,), dtype="float128")
        with pytest.raises(gpu_ipc.PoolFull, match="no room"):
            pool.alloc("big", (1 << 20,))
        with pytest.raises(ValueError, match="invalid buffer name"):
            pool.alloc("", (4,))
    with pytest.raises(gpu_ipc.ClosedError):
        pool.alloc("late", (4,))
