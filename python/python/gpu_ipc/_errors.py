"""The exceptions of gpu_ipc, one class per case of the Rust core's error enums (``FrameError``, ``SemaphoreError``,
``PoolError``), raised by the native module (``gpu_ipc._gpu_ipc`` imports them from here) and exported by
``gpu_ipc``.

Every one is a ``GpuIpcError``. An argument the package refuses raises ``ArgumentError`` (a ``ValueError`` too) or
``ArgumentTypeError`` (a ``TypeError`` too), so ``except GpuIpcError`` catches them and ``except ValueError`` still
does. The classes are defined in Python so that an argument error can have both bases, and so that ``help()`` shows
each one's own text only, not every method of ``BaseException`` again (their metaclass lists a class's own names).
"""

from __future__ import annotations

from typing import Any


class _ErrorClass(type):
    """The metaclass of gpu_ipc's exceptions: ``dir(cls)`` (what ``help()`` and ``pydoc`` list) is the class's own
    public names; everything else is ``Exception``'s, as for any exception. Instances are not affected."""

    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any]) -> _ErrorClass:
        namespace["__module__"] = "gpu_ipc"
        return super().__new__(mcs, name, bases, namespace)

    def __dir__(cls) -> list[str]:
        return sorted(name for name in vars(cls) if not name.startswith("_"))


class GpuIpcError(Exception, metaclass=_ErrorClass):
    """The base of every gpu_ipc error; the message is the Rust core's, in words."""


class ArgumentError(GpuIpcError, ValueError):
    """An argument's value is refused (a ``ValueError`` too)."""


class ArgumentTypeError(GpuIpcError, TypeError):
    """An argument of a type the call does not take (a ``TypeError`` too)."""


class ProducerGone(GpuIpcError):
    """The producer died (or hung up): not a clean end of stream. ``.pid``: its process."""

    pid: int


class PeerGone(GpuIpcError):
    """The peer awaited died during the wait."""


class Evicted(GpuIpcError):
    """The producer evicted this consumer (``.consumer``: its record); attach again to go on."""

    consumer: int


class Timeout(GpuIpcError):
    """A bounded wait ran out: ``.what`` it waited for, ``.waited`` seconds."""

    what: str
    waited: float


class GpuWaitGaveUp(GpuIpcError):
    """A GPU-side wait of gpu-poll gave up at its deadline."""


class AdmissionError(GpuIpcError):
    """The producer's admission thread stopped accepting."""


class EndOfStream(GpuIpcError):
    """The producer closed the ring: the clean end of a stream. ``.published``: the frames it published;
    ``.past_end``: the sequence of a frame handed out past the end (GPU-side strategies), else ``None``."""

    published: int
    past_end: int | None


class ForeignToken(GpuIpcError):
    """A slot or frame that is not this producer's or consumer's."""


class ConfigError(GpuIpcError):
    """The ring's configuration (or a use of an object) is not usable."""


class StrategyUnavailable(GpuIpcError):
    """The sync strategy cannot run on this backend or device."""


class Refused(GpuIpcError):
    """The other end refused to attach this one."""


class BackendError(GpuIpcError):
    """Allocation, export or import failed, or memory this backend cannot share (the message says what to do)."""


class DriverError(GpuIpcError):
    """A CUDA driver call failed."""


class NoDriver(DriverError):
    """No CUDA driver on this machine (use ``backend="host"``)."""


class RingError(GpuIpcError):
    """The ring's control block said no."""


class WireError(GpuIpcError):
    """Protocol or socket error."""


class NoProducer(WireError):
    """No producer listens at the socket path: start it first."""


class ReleasedError(GpuIpcError):
    """A frame or slot used after it went back to the ring, or a pool buffer after it was freed."""


class ClosedError(GpuIpcError):
    """A producer, consumer, pool or semaphore used after ``close()``."""


class NoOwner(WireError):
    """Nothing listens at the socket path: start the owner first."""


class OwnerGone(GpuIpcError):
    """The process that owns the shared object is gone."""


class PosterDied(GpuIpcError):
    """A peer that had posted died without detaching (``.pid``, ``.record``): the semaphore is poisoned until its
    owner resets it."""

    pid: int | None
    record: int


class SemaphoreClosed(GpuIpcError):
    """The semaphore's owner closed it."""


class NotFound(GpuIpcError):
    """No live buffer of the pool has that name (``.name``)."""

    name: str


class StaleBuffer(GpuIpcError):
    """The pool buffer was freed, its name maybe reused (``.name``, ``.held_generation``, ``.current``)."""

    name: str
    held_generation: int
    current: int | None


class NameTaken(GpuIpcError):
    """A live buffer of the pool has that name already."""


class PoolFull(GpuIpcError):
    """The pool has no room (memory, directory or allocations)."""
