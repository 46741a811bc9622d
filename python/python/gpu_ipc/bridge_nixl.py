"""The bridge's transport over NIXL (its UCX backend): agent metadata through NIXL's own listener, notifications
through ``send_notif`` / ``get_new_notifs``, frames through one-sided WRITEs with the notification attached, and which
UCX transport carried them (UCX's protocol tables, ``UCX_PROTO_INFO``).

NIXL is optional: :func:`load_nixl` raises :class:`NixlMissing`, saying what to install, where it is absent.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import threading
import time
from types import ModuleType
from typing import Any

from gpu_ipc.bridge_protocol import BridgeError, PeerGone, TransportError
from gpu_ipc.bridge_staging import DeviceStaging

NIXL_MODULES = ("nixl_cu13", "nixl_cu12", "nixl")  # the CUDA wheels export the API themselves; `nixl` picks one
# Transports that carry GPU memory without staging it through host memory (CUDA IPC inside a node; RDMA verbs,
# with GPUDirect, across nodes). A VRAM WRITE over anything else (tcp) is the silent fallback worth a warning.
GPU_DIRECT = ("cuda_ipc", "rc", "dc", "ud", "gdr", "srd")
RETRY_S = 0.5  # how often the sending end asks the receiving end's listener again while it has no answer


def _failure(what: str, e: Exception) -> BridgeError:
    """NIXL's exception as the bridge's: the peer's disconnection as :class:`PeerGone`, the rest as
    :class:`TransportError`."""
    if "DISCONNECT" in repr(e) or "REMOTE" in type(e).__name__.upper():
        return PeerGone(f"{what}: {e!r}: the other end died or is unreachable", repr(e))
    return TransportError(f"{what}: {e!r}")


class NixlMissing(BridgeError):
    """NIXL's Python package is not installed (or does not load)."""


def load_nixl() -> ModuleType:
    """The NIXL module (``nixl_agent``, ``nixl_agent_config``); :class:`NixlMissing` with what to do otherwise."""
    errors = []
    for name in NIXL_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError as e:
            errors.append(f"{name}: {e}")
    raise NixlMissing(
        "NIXL is not installed: `pip install nixl-cu13==1.5.1` (CUDA 13; nixl-cu12 for CUDA 12), or put an unpacked "
        "wheel on PYTHONPATH with NIXL_PLUGIN_DIR at its plugins (" + "; ".join(errors) + ")")


_PREFIX = re.compile(r"^\[[0-9.]+\]\s+\[[^\]]*\]\s+")


class ProtocolTables:
    """Keeps UCX's protocol tables (``UCX_PROTO_INFO=y`` prints them on stdout when an endpoint is configured) out
    of this process's stdout and reads from them which transports carry remote memory writes.

    Stdout (file descriptor 1) goes through a pipe; a thread passes every line through but the tables' own.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._saved = -1
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> bool:
        """Turns the tables on (before NIXL creates its UCX context); False if the user set UCX_PROTO_INFO."""
        if "UCX_PROTO_INFO" in os.environ:
            return False
        os.environ["UCX_PROTO_INFO"] = "y"
        sys.stdout.flush()
        read, write = os.pipe()
        self._saved = os.dup(1)
        os.dup2(write, 1)
        os.close(write)
        self._thread = threading.Thread(target=self._pass_through, args=(read,), name="ucx-proto-info", daemon=True)
        self._thread.start()
        return True

    def _pass_through(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as pipe:
            for raw in pipe:
                line = raw.decode("utf-8", "replace")
                if _PREFIX.match(line):
                    with self._lock:
                        self.lines.append(_PREFIX.sub("", line).rstrip())
                else:
                    os.write(self._saved, raw)

    def stop(self) -> None:
        """Gives stdout back."""
        if self._saved < 0:
            return
        sys.stdout.flush()
        os.dup2(self._saved, 1)  # closes the pipe's last write end: the thread reads to the end
        if self._thread is not None:
            self._thread.join(1.0)
        os.close(self._saved)
        self._saved = -1

    def write_transports(self) -> dict[str, list[str]]:
        """For each kind of remote memory write UCX configured towards another process (``intra-node`` /
        ``inter-node``; not ``self``), the transports in its table: ``{"intra-node: from cuda memory to cuda":
        ["cuda_ipc/cuda"]}``."""
        with self._lock:
            lines = list(self.lines)
        found: dict[str, list[str]] = {}
        title = ""
        scope = ""
        for line in lines:
            if line.lstrip().startswith("+"):  # a table's border
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 1 and cells[0]:
                text = cells[0]
                if " cfg#" in text:
                    scope = text
                elif "remote memory write" in text:
                    title = text
                else:
                    title = ""
            elif len(cells) == 3 and title and "self" not in scope.split()[1:2] and cells[2] and cells[0] != "Range":
                key = f"{scope.split()[1] if len(scope.split()) > 1 else scope}: {title}"
                found.setdefault(key, [])
                if cells[2] not in found[key]:
                    found[key].append(cells[2])
        return found


def transport_findings(writes: dict[str, list[str]], memory: str) -> tuple[str, str | None]:
    """A one-line account of the transports that carry the frames, and a warning when VRAM goes over something
    that is not GPU-direct (tcp: the silent fallback), or nothing was seen."""
    if not writes:
        return "no UCX protocol table for remote writes was printed (UCX_PROTO_INFO set by the user?)", None
    account = "; ".join(f"{k} -> {', '.join(v)}" for k, v in sorted(writes.items()))
    names = {t.split("/")[0] for v in writes.values() for t in v}
    if memory == "VRAM" and not any(n.startswith(GPU_DIRECT) for n in names):
        return account, (f"GPU frames travel over {', '.join(sorted(names))}, not CUDA IPC or RDMA: expect host "
                         "copies and a fraction of the bandwidth (check UCX_TLS, UCX_NET_DEVICES, the RDMA devices)")
    return account, None


class NixlTransport:
    """One NIXL agent, one peer. The receiving end listens on ``port``; the sending end listens on a free port and
    exchanges metadata with the receiving end's listener (``ip``:``port``).

    ``memory``: ``"VRAM"`` (GPU rings) or ``"DRAM"`` (``backend="host"``). ``staging``: ``"auto"`` (copy frames
    through a buffer of this process's own when NIXL cannot register the source memory), ``"always"``, ``"never"``.
    """

    def __init__(self, name: str, peer: str, memory: str, port: int, connect_to: str | None = None,
                 tables: ProtocolTables | None = None, staging: str = "auto") -> None:
        nixl = load_nixl()
        self.memory = memory
        self.name = name
        self.peer = peer
        self.tables = tables
        listen_port = 0 if connect_to is not None else port
        config = nixl.nixl_agent_config(enable_prog_thread=True, enable_listen_thread=True, listen_port=listen_port,
                                        backends=["UCX"])
        try:
            self.agent: Any = nixl.nixl_agent(name, config)
        except Exception as e:  # NIXL's own exception classes: the boundary of a foreign library
            raise TransportError(f"NIXL agent {name!r} (UCX backend, listener on port {listen_port}) could not "
                                 f"start: {e!r}; is the port taken?") from e
        if "UCX" not in self.agent.backends:
            raise TransportError(f"NIXL has no UCX backend (plugins found: {self.agent.plugin_list}); set "
                                 "NIXL_PLUGIN_DIR to the wheel's plugins directory")
        self.connect_to = connect_to
        self.port = port
        self._local: dict[tuple[int, int], Any] = {}  # (ptr, nbytes) -> registration
        self._exposed: dict[tuple[int, int], Any] = {}
        self._handles: dict[tuple[int, int, int], Any] = {}
        # Frames from memory UCX cannot register (imported from another process) go through a buffer of our own:
        # "auto" when registering fails, "always", or "never" (the failure is the error).
        self.staging_mode = staging
        self.staging: DeviceStaging | None = None
        self.staging_reason = ""

    def connect(self, timeout: float) -> None:
        """Exchanges agent metadata through NIXL's listener: the sending end fetches the receiving end's and sends
        its own (again every ``RETRY_S`` until it has the peer's: a listener that was not up yet drops them, and once
        more after); both wait until they know the peer, within ``timeout``."""
        deadline = time.monotonic() + timeout
        asked = 0.0
        while True:
            try:
                known = bool(self.agent.check_remote_metadata(self.peer))
                if self.connect_to is not None and (known or time.monotonic() - asked >= RETRY_S):
                    if not known:
                        self.agent.fetch_remote_metadata(self.peer, self.connect_to, self.port)
                    self.agent.send_local_metadata(self.connect_to, self.port)
                    asked = time.monotonic()
            except Exception as e:
                raise _failure(f"NIXL could not exchange metadata with {self.peer!r}", e) from e
            if known:
                return
            if time.monotonic() > deadline:
                where = (f"at {self.connect_to}:{self.port}" if self.connect_to is not None
                         else f"on port {self.port}")
                raise PeerGone(f"no metadata from NIXL agent {self.peer!r} {where} within {timeout} s: start the "
                               "other end (same --name), check the address and that the port is open")
            time.sleep(0.002)

    def send(self, message: bytes) -> None:
        try:
            self.agent.send_notif(self.peer, message)
        except Exception as e:
            raise _failure(f"NIXL could not notify {self.peer!r}", e) from e

    def receive(self) -> list[bytes]:
        try:
            notifs = self.agent.get_new_notifs()
        except Exception as e:
            raise _failure("NIXL could not read notifications", e) from e
        return list(notifs.get(self.peer, []))

    def expose(self, ptr: int, nbytes: int, device: int) -> bytes:
        if (ptr, nbytes) in self._exposed:
            return b""
        try:
            reg = self.agent.register_memory([(ptr, nbytes, device, "")], self.memory)
            info: bytes = self.agent.get_partial_agent_metadata(reg, False, ["UCX"])
        except Exception as e:
            raise TransportError(f"NIXL could not register {nbytes} bytes of {self.memory} at {ptr:#x} "
                                 f"(device {device}): {e!r}") from e
        self._exposed[(ptr, nbytes)] = reg
        return info

    def learn(self, info: bytes) -> None:
        if info:
            try:
                self.agent.add_remote_agent(info)
            except Exception as e:
                raise _failure("NIXL could not load the receiving end's new registration", e) from e

    def write(self, ptr: int, nbytes: int, device: int, remote_ptr: int, remote_device: int,
              notification: bytes) -> Any:
        if self.staging is None and (ptr, nbytes) not in self._local:
            try:
                if self.staging_mode == "always" and self.memory == "VRAM":
                    raise TransportError("staging asked for (--staging always)")
                self._local[(ptr, nbytes)] = self.agent.register_memory([(ptr, nbytes, device, "")], self.memory)
            except Exception as e:
                if self.memory != "VRAM" or self.staging_mode == "never":
                    raise _failure(f"NIXL could not register {nbytes} bytes at {ptr:#x} (device {device})", e) from e
                self.staging = DeviceStaging(nbytes, device)
                self.staging_reason = repr(e)
                self._local[(self.staging.ptr, nbytes)] = self.agent.register_memory(
                    [(self.staging.ptr, nbytes, device, "")], self.memory)
        if self.staging is not None:
            ptr = self.staging.copy_in(ptr, nbytes)
        try:
            key = (ptr, remote_ptr, nbytes)
            handle = self._handles.get(key)
            if handle is None:
                local = self.agent.get_xfer_descs([(ptr, nbytes, device)], self.memory)
                remote = self.agent.get_xfer_descs([(remote_ptr, nbytes, remote_device)], self.memory)
                handle = self.agent.initialize_xfer("WRITE", local, remote, self.peer, notification)
                self._handles[key] = handle
            state = self.agent.transfer(handle, notification)
        except Exception as e:
            raise _failure(f"NIXL could not start a WRITE of {nbytes} bytes to {self.peer!r}", e) from e
        if state == "ERR":
            raise TransportError(f"NIXL's WRITE of {nbytes} bytes to {self.peer!r} failed at once (peer gone?)")
        return handle

    def done(self, handle: Any) -> bool:
        try:
            state = self.agent.check_xfer_state(handle)
        except Exception as e:
            raise _failure(f"NIXL could not tell the state of a WRITE to {self.peer!r}", e) from e
        if state == "ERR":
            raise TransportError(f"NIXL's WRITE to {self.peer!r} ended in error: the other end died or the "
                                 "network failed")
        return bool(state == "DONE")

    def close(self) -> None:
        """Releases the transfers and registrations (best effort: the peer may be gone)."""
        for handle in self._handles.values():
            try:
                self.agent.release_xfer_handle(handle)
            except Exception:  # a transfer to a dead peer may refuse: the agent's teardown takes it
                pass
        self._handles.clear()
        for reg in [*self._local.values(), *self._exposed.values()]:
            try:
                self.agent.deregister_memory(reg)
            except Exception:
                pass
        self._local.clear()
        self._exposed.clear()
        if self.staging is not None:
            self.staging.close()
