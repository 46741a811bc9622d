"""gpu_ipc: share GPU frames between processes through the CUDA driver API, read in place as tensors.

A :class:`Producer` publishes frames into a ring of slots in one shared GPU allocation; :class:`Consumer` objects in
other processes attach once and read each :class:`Frame` in place, as a PyTorch / CuPy / JAX / NumPy array with no
copy (DLPack, and ``__cuda_array_interface__`` on a GPU), then release it so the producer may rewrite its slot.

Producer::

    import torch, gpu_ipc
    with gpu_ipc.Producer("/tmp/frames.sock", width=3840, height=2160, sync="ipc-event", backend="vmm") as producer:
        producer.wait_for_consumers(1, timeout=30)
        for i in range(1000):
            slot = producer.acquire()
            torch.from_dlpack(slot).fill_(i % 256)   # writes the slot in place, on the default stream
            producer.publish(slot)
        producer.drain(timeout=10)

Consumer, in another process::

    import torch, gpu_ipc
    with gpu_ipc.Consumer("/tmp/frames.sock", backend="vmm", wait_for_producer=10) as consumer:
        for frame in consumer:                      # ends cleanly at the end of the stream
            image = torch.from_dlpack(frame)        # (height, width, 3) uint8 on the GPU, no copy
            print(frame.seq, image.float().mean())  # the frame is released when the next one is asked for

Without a GPU, ``backend="host"`` runs the same API on shared host memory (CPU strategies ``cpu-spin`` and
``cpu-sleep``), and ``numpy.from_dlpack(frame)`` reads it in place.
"""

from gpu_ipc._gpu_ipc import (
    LEGACY_DEFAULT_STREAM,
    AdmissionError,
    BackendError,
    ClosedError,
    ConfigError,
    Consumer,
    DriverError,
    EndOfStream,
    Evicted,
    ForeignToken,
    Frame,
    GpuIpcError,
    GpuWaitGaveUp,
    NoDriver,
    NoOwner,
    NoProducer,
    OwnerGone,
    PeerGone,
    PosterDied,
    Producer,
    ProducerGone,
    Refused,
    ReleasedError,
    RingError,
    Semaphore,
    SemaphoreClosed,
    SemaphoreWait,
    Slot,
    StrategyUnavailable,
    Timeout,
    WireError,
    __version__,
)

__all__ = [
    "LEGACY_DEFAULT_STREAM",
    "AdmissionError",
    "BackendError",
    "ClosedError",
    "ConfigError",
    "Consumer",
    "DriverError",
    "EndOfStream",
    "Evicted",
    "ForeignToken",
    "Frame",
    "GpuIpcError",
    "GpuWaitGaveUp",
    "NoDriver",
    "NoOwner",
    "NoProducer",
    "OwnerGone",
    "PeerGone",
    "PosterDied",
    "Producer",
    "ProducerGone",
    "Refused",
    "ReleasedError",
    "RingError",
    "Semaphore",
    "SemaphoreClosed",
    "SemaphoreWait",
    "Slot",
    "StrategyUnavailable",
    "Timeout",
    "WireError",
    "__version__",
]
