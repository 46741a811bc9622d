"""A ring bridged over NIXL (UCX), so that consumers on another machine read the same frames.

Two ends, each its own process::

    # on the other machine: ring B, made alike, which local consumers attach to as usual
    python -m gpu_ipc.bridge receive --socket /tmp/b.sock --port 5600 --consumers 2
    # on the machine of ring A (its producer runs with a CPU sync strategy: ipc-event, cpu-spin or cpu-sleep)
    python -m gpu_ipc.bridge send --socket /tmp/a.sock --connect 10.0.0.2 --port 5600 --expect gpu-direct

The sending end is an ordinary consumer of ring A; the receiving end is ring B's producer. NIXL WRITEs each frame
from A's slot into a place the receiving end granted: one of its landing buffers (its own ``cuMemAlloc`` memory,
which UCX reaches over CUDA IPC or RDMA whatever the ring's backend; several frames in flight; one device copy
into B's slot there) or B's slot itself (one frame at a time). A's frame is released once the write is complete
and B's slot published once it holds the frame, so a slow consumer of B slows A's producer, as a local consumer
would. Before the first frame the sending end probes the paths with it and takes the first that UCX put on a GPU
path (``--path``); it says which, from UCX's own protocol table for those writes, and ``--expect gpu-direct``
refuses anything else (exit 3). Agent metadata goes through NIXL's listener (the receiving end listens on
``--port``, TCP); frames and notifications go through UCX.

Failures: either end's death (or the network's) is an error on the other within ``--peer-timeout`` (heartbeats;
at once when UCX reports the peer unreachable). The receiving end then exits without closing ring B, so B's
consumers get ``ProducerGone``, not a clean end; the end of A's stream passes through as B's end of stream, and the
death of A's producer as a failure. Needs NIXL (``pip install nixl-cu13``); see docs/beyond-one-machine.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import gpu_ipc
from gpu_ipc.bridge_nixl import NixlMissing, NixlTransport, ProtocolTables, transport_findings
from gpu_ipc.bridge_protocol import (
    DEFAULT_WINDOW,
    EXPECTS,
    PATHS,
    REPORT_EVERY_S,
    BridgeError,
    PeerGone,
    ProtocolError,
    SendingEnd,
    TransportError,
    TransportRefused,
)
from gpu_ipc.bridge_receive import ReceivingEnd
from gpu_ipc.bridge_staging import DeviceLanding, HostLanding

__all__ = ["BridgeError", "NixlMissing", "PeerGone", "ProtocolError", "TransportError", "TransportRefused",
           "receive", "send"]

DEFAULT_PORT = 5600
DEFAULT_NAME = "gpu-ipc-bridge"
# The bridge reads and publishes frames when the CPU knows they are ready: the strategies whose waits the CPU does,
# as the core's descriptor says (gpu_ipc.sync_strategies()).
CPU_STRATEGIES = tuple(str(s["name"]) for s in gpu_ipc.sync_strategies() if s["waits"] == "cpu")


def _default_sync(backend: str) -> str:
    """Deliberately not gpu_ipc.default_sync (a GPU-waiting strategy): the first CPU-waiting strategy the backend
    runs, preferring one whose publish the GPU marks (ipc-event: the receiving end does not wait on the CPU for each
    frame's copy); cpu-spin with the host backend."""
    runs = [s for s in gpu_ipc.sync_strategies()
            if s["waits"] == "cpu" and (backend != "host" or not s["needs_cuda"])]
    gpu_marked = [s for s in runs if s["publishes"] == "gpu"]
    return str((gpu_marked or runs)[0]["name"])


def _memory(backend: str) -> str:
    return "DRAM" if backend == "host" else "VRAM"


def _log(side: str, text: str) -> None:
    print(f"bridge {side}: {text}", file=sys.stderr, flush=True)


def send(socket: str, connect: str, port: int = DEFAULT_PORT, name: str = DEFAULT_NAME, backend: str = "vmm",
         device: int = 0, wait_for_producer: float = 10.0, connect_timeout: float = 10.0,
         peer_timeout: float = 0.6, tables: ProtocolTables | None = None, staging: str = "auto",
         path: str = "auto", expect: str = "any", report_every: float = REPORT_EVERY_S,
         progress_thread: bool = False) -> dict[str, Any]:
    """The sending end: attaches to ring ``socket`` as a consumer and writes every frame to the receiving end at
    ``connect``:``port`` until the ring's end of stream. Returns a summary (frames, FPS, the path and the transport
    its probe found, the run's reports).

    Before the first frame it probes the paths the receiving end offers (``path``: ``auto``, ``landing``,
    ``direct``) with that frame, and takes the transport from what UCX says of those WRITEs (``tables``: UCX's
    protocol tables, read; without them, from the probe's rate). ``expect="gpu-direct"`` refuses a path that is not
    CUDA IPC or RDMA for GPU frames (:class:`TransportRefused`, before the first frame is published on the other
    side). ``staging``: copy frames through buffers of this process's own when UCX cannot register ring A's memory
    (``auto``), ``always``, ``never``. ``progress_thread``: run NIXL's progress thread (off: this end's own calls
    move UCX; see :class:`gpu_ipc.bridge_nixl.NixlTransport`). The summary's ``cpu_us_per_frame`` is this process's
    CPU time while frames flowed over the frames (``thread_cpu_us_per_frame``: the end's own thread's).

    Raises :class:`PeerGone` (the receiving end died, went silent or failed), :class:`TransportError`,
    :class:`TransportRefused`, ``gpu_ipc.ProducerGone`` (ring's producer died: the receiving end is told),
    :class:`BridgeError`.
    """
    memory = _memory(backend)
    with gpu_ipc.Consumer(socket, backend=backend, name="bridge-send", device=device,
                          wait_for_producer=wait_for_producer) as consumer:
        if consumer.sync not in CPU_STRATEGIES:
            raise BridgeError(f"ring {socket} uses sync {consumer.sync!r}: the bridge reads frames when the CPU "
                              f"knows they are ready; start its producer with one of {', '.join(CPU_STRATEGIES)}")
        transport = NixlTransport(f"{name}.send", f"{name}.receive", memory, port, connect_to=connect, tables=tables,
                                  staging=staging, lanes=max(1, consumer.slots),  # WRITEs in flight <= slots
                                  progress_thread=progress_thread)
        try:
            transport.connect(connect_timeout)
            end = SendingEnd(transport, consumer, 0 if backend == "host" else device, peer_timeout=peer_timeout,
                             path=path, expect=expect, report_every=report_every,
                             log=lambda text: _log("send", text))
            end.hello()
            _log("send", f"connected to {connect}:{port}; {consumer.nbytes} bytes a frame ({memory})")
            summary = end.run()
            summary["staged"] = transport.staging is not None
            summary["nixl_progress_thread"] = progress_thread
            if transport.staging is not None:
                summary["staged_because"] = transport.staging_reason
                summary["staging_copy_ms_mean"] = transport.staging.copy_s / max(transport.staging.copies, 1) * 1e3
        finally:
            transport.close()
    if tables is not None:
        writes = tables.write_transports()
        summary["ucx_writes"] = writes
        summary["ucx_tables"] = transport_findings(writes, memory)[0]
    return summary


def receive(socket: str, port: int = DEFAULT_PORT, name: str = DEFAULT_NAME, backend: str = "vmm", device: int = 0,
            slots: int | None = None, sync: str | None = None, consumers: int = 1, wait_for_sender: float = 60.0,
            wait_for_consumers: float = 60.0, peer_timeout: float = 0.6, stall_timeout: float = 30.0,
            on_publish: Any = None, window: int = DEFAULT_WINDOW, progress_thread: bool = False) -> dict[str, Any]:
    """The receiving end: listens on ``port`` for the sending end, makes ring ``socket`` like the sending end's
    (slots: ``slots`` or as many), admits ``consumers`` consumers, then publishes every frame written into it until
    the sending end's end of stream, and closes the ring (its consumers get ``EndOfStream``).

    ``window``: landing buffers of this process's own (``cuMemAlloc``; host memory with the host backend) that the
    sending end may write frames into, up to ``window`` at a time, each copied into the ring's slot here; 0: none
    (frames only into the ring's slots). On the direct path the ring's slots themselves, up to ``window`` (at least
    one, at most all but one) held and granted at once. The sending end chooses (see :func:`send`).
    ``progress_thread`` and the summary's ``cpu_us_per_frame``: as for :func:`send`.

    On any failure (:class:`PeerGone` above all) ring ``socket`` is left open, not closed (kept alive in ``ABANDONED``): closing it would
    tell its consumers that the stream ended cleanly. End the process (the command does at once), so that they get
    ``ProducerGone``.
    """
    sync = sync or _default_sync(backend)
    if sync not in CPU_STRATEGIES:
        raise BridgeError(f"sync {sync!r}: the receiving end publishes on the CPU; use one of "
                          f"{', '.join(CPU_STRATEGIES)}")
    transport = NixlTransport(f"{name}.receive", f"{name}.send", _memory(backend), port,
                              progress_thread=progress_thread)
    try:
        _log("receive", f"NIXL listener on port {port}; waiting for agent {name}.send")
        transport.connect(wait_for_sender)
        ring_device = 0 if backend == "host" else device

        def make_landing(nbytes: int, count: int) -> Any:
            if backend == "host":
                return HostLanding(nbytes, count)
            return DeviceLanding(nbytes, count, ring_device)

        end = ReceivingEnd(transport, peer_timeout=peer_timeout, stall_timeout=stall_timeout, window=window,
                           make_landing=make_landing)
        end.on_publish = on_publish
        layout = end.wait_hello(wait_for_sender)
        producer = gpu_ipc.Producer(socket, shape=layout["shape"], dtype=layout["dtype"],
                                    slots=slots or int(layout["slots"]), sync=sync, backend=backend, device=device)
        try:
            _log("receive", f"ring {socket}: {layout['shape']} {layout['dtype']}; waiting for {consumers} consumers")
            deadline = time.monotonic() + wait_for_consumers
            while True:  # in slices, answering the sending end's heartbeats
                try:
                    producer.wait_for_consumers(consumers, timeout=0.05)
                    break
                except gpu_ipc.Timeout:
                    if time.monotonic() > deadline:
                        raise
                    for kind, _body in end.live.receive():
                        raise ProtocolError(f"the sending end sent {kind!r} before its first grant")
            summary = end.run(producer, ring_device)
            summary["nixl_progress_thread"] = progress_thread
            _log("receive", f"path {summary['path']} (window {summary['window']})")
        except BaseException:
            ABANDONED.append(producer)
            raise
        producer.close()
        return summary
    finally:
        transport.close()


ABANDONED: list[Any] = []  # rings whose sending end died: left open for the process to end (see `receive`)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpu_ipc.bridge", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="side", required=True)
    for side in ("send", "receive"):
        s = sub.add_parser(side)
        s.add_argument("--socket", required=True, help="the local ring's socket (read: send; created: receive)")
        s.add_argument("--port", type=int, default=DEFAULT_PORT, help="the receiving end's NIXL listener port")
        s.add_argument("--name", default=DEFAULT_NAME, help="agent names <name>.send / <name>.receive (both ends)")
        s.add_argument("--backend", default="vmm", choices=["vmm", "legacy", "host"])
        s.add_argument("--device", type=int, default=0)
        s.add_argument("--peer-timeout", type=float, default=0.6, help="seconds of silence that mean the peer died")
        s.add_argument("--nixl-progress-thread", action="store_true",
                       help="run NIXL's progress thread (it spins: a core's worth of CPU); by default this end's "
                            "own polls move UCX")
    snd, rcv = sub.choices["send"], sub.choices["receive"]
    snd.add_argument("--connect", required=True, help="the receiving end's address (IP or host name)")
    snd.add_argument("--wait-for-producer", type=float, default=10.0)
    snd.add_argument("--connect-timeout", type=float, default=10.0)
    snd.add_argument("--staging", choices=["auto", "always", "never"], default="auto",
                     help="copy GPU frames through a buffer of this process's own before sending: when NIXL cannot "
                          "register ring A's memory (auto), always, or never")
    snd.add_argument("--path", choices=list(PATHS), default="auto",
                     help="where frames are written: the receiving end's landing buffers (several in flight, one "
                          "copy there), its ring's slots (several in flight, no copy), or auto: landing if its probe goes over a "
                          "GPU path, else direct if its does")
    snd.add_argument("--expect", choices=list(EXPECTS), default="any",
                     help="gpu-direct: refuse (exit 3, before the first frame) a path of GPU frames that is not CUDA "
                          "IPC or RDMA, as UCX reports the probe's writes")
    snd.add_argument("--report-every", type=float, default=REPORT_EVERY_S,
                     help="seconds between reports of the rate and the transport during the run")
    rcv.add_argument("--slots", type=int, default=None, help="slots of the ring made (default: as the sender's)")
    rcv.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                     help="landing buffers the sending end may write into, so frames in flight (0: none); on the "
                          "direct path, the ring's slots granted at once (at most all but one)")
    rcv.add_argument("--sync", default=None, choices=list(CPU_STRATEGIES))
    rcv.add_argument("--consumers", type=int, default=1, help="consumers to admit before the first frame")
    rcv.add_argument("--wait-for-sender", type=float, default=60.0)
    rcv.add_argument("--wait-for-consumers", type=float, default=60.0)
    rcv.add_argument("--stall-timeout", type=float, default=30.0,
                     help="seconds the ring's consumers may hold a slot before the bridge gives up")
    return p


def main(argv: list[str] | None = None) -> int:
    """The command: one JSON summary line on stdout, progress and errors on stderr. Exit 0: the end of the stream
    passed; 1: a failure (the message says which end and why); 2: NIXL missing or bad arguments; 3: ``--expect
    gpu-direct`` and UCX put the GPU frames on something else (refused before the first frame, or when UCX changed
    its path during the run)."""
    args = _parser().parse_args(argv)
    tables = ProtocolTables()
    try:
        if args.side == "send":
            tables.start()
            try:
                summary = send(args.socket, args.connect, args.port, args.name, args.backend, args.device,
                               args.wait_for_producer, args.connect_timeout, args.peer_timeout, tables,
                               args.staging, args.path, args.expect, args.report_every,
                               progress_thread=args.nixl_progress_thread)
            finally:
                tables.stop()
            _log("send", f"path {summary['path']} (window {summary['window']}): {summary['transport']}")
            if summary["transport_warning"]:
                _log("send", f"WARNING: {summary['transport_warning']}")
        else:
            summary = receive(args.socket, args.port, args.name, args.backend, args.device, args.slots, args.sync,
                              args.consumers, args.wait_for_sender, args.wait_for_consumers, args.peer_timeout,
                              args.stall_timeout, window=args.window, progress_thread=args.nixl_progress_thread)
    except NixlMissing as e:
        _log(args.side, str(e))
        return 2
    except TransportRefused as e:
        _log(args.side, f"refused: {e}")
        print(json.dumps({"side": args.side, "outcome": "refused", "error": f"TransportRefused: {e}"}), flush=True)
        return 3
    except Exception as e:  # the command's boundary: every failure is reported the same way
        _log(args.side, f"error: {type(e).__name__}: {e}")
        print(json.dumps({"side": args.side, "outcome": "error", "error": f"{type(e).__name__}: {e}"}), flush=True)
        if ABANDONED:
            # Not closed: the ring's consumers get ProducerGone from this process's end, not EndOfStream.
            sys.stderr.flush()
            os._exit(1)
        return 1
    print(json.dumps({"side": args.side, **summary}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
