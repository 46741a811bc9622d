"""The CUDA driver API as cuda_consumer.py calls it, through cuda-bindings: loading the bindings, one checked call
(CudaError names the call and its CUresult), and the struct and UUID helpers (split out of cuda_consumer.py)."""

import ctypes
import sys

sys.dont_write_bytecode = True  # no __pycache__ next to the scripts
from consumer import ConsumerError  # noqa: E402  (next to this file)
from frame_check import log  # noqa: E402


class CudaError(ConsumerError):
    """A CUDA call failed, or CUDA is not there (exit 1). The text names the call and its CUresult."""


# ---------------------------------------------------------------------------------------------------------------
# The CUDA driver API through cuda-bindings
# ---------------------------------------------------------------------------------------------------------------


def load_cuda_bindings():
    """The driver module: `cuda.bindings.driver` (cuda-bindings, CUDA 12.6 and later), else `cuda.cuda` (older
    cuda-python). CudaError, saying what to install, when neither imports."""
    try:
        from cuda.bindings import driver
        return driver
    except ImportError:
        pass
    try:
        from cuda import cuda as driver  # older cuda-python
        return driver
    except ImportError:
        pass
    raise CudaError("cuda-bindings is not installed (neither `cuda.bindings.driver` nor `cuda.cuda` imports): "
                    "install it with `python3 -m pip install cuda-bindings` (or cuda-python), "
                    "or use consumer.py for the host-fake backend")


class Driver:
    """Calls into the driver module, each result checked: `call` raises CudaError naming the function and the
    CUresult's name (cuGetErrorName); `status` returns the CUresult for calls where a failure is an answer
    (cuEventQuery's CUDA_ERROR_NOT_READY)."""

    def __init__(self, module):
        self.cu = module
        self.success = module.CUresult.CUDA_SUCCESS
        self.not_ready = module.CUresult.CUDA_ERROR_NOT_READY

    def error_name(self, result):
        """`CUDA_ERROR_...` for a CUresult, or its number when even cuGetErrorName fails."""
        try:
            err, name = self.cu.cuGetErrorName(result)
            if err == self.success and name:
                return name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # the error name is best effort: the number is printed anyway
            pass
        return f"CUresult {int(result)}"

    def status(self, name, *args):
        """(CUresult, values) of `name(*args)`."""
        function = getattr(self.cu, name, None)
        if function is None:
            raise CudaError(f"{name} is not in this cuda-bindings ({self.cu.__name__}); install a newer one")
        try:
            out = function(*args)
        except Exception as err:  # e.g. no libcuda.so.1: the bindings raise instead of returning a CUresult
            raise CudaError(f"{name} failed: {type(err).__name__}: {err}".splitlines()[0]) from None
        return out[0], out[1:]

    def call(self, name, *args):
        """`name(*args)`, which must return CUDA_SUCCESS; returns its value (None, one value, or a tuple)."""
        result, values = self.status(name, *args)
        if result != self.success:
            raise CudaError(f"{name} failed: {self.error_name(result)} ({int(result)})")
        if not values:
            return None
        return values[0] if len(values) == 1 else values

    def try_call(self, name, *args):
        """Like `call` for teardown: a failure is printed, never raised."""
        try:
            self.call(name, *args)
        except CudaError as err:
            log(f"while leaving: {err}")


def struct_bytes(value, size):
    """The first `size` bytes of a cuda-bindings struct (CUuuid, CUipcMemHandle...)."""
    return ctypes.string_at(value.getPtr(), size)


def struct_from_bytes(cls, data):
    """A cuda-bindings struct of class `cls` holding `data` (a 64-byte IPC handle)."""
    value = cls()
    ctypes.memmove(value.getPtr(), data, len(data))
    return value


def uuid_text(uuid):
    """GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as nvidia-smi -L shows it (protocol.md, RingOffer.device_uuid)."""
    h = uuid.hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
