"""Coverage-guided fuzzing (atheris, libFuzzer for Python) of the bridge's protocol decoders
(python/python/gpu_ipc/bridge_protocol.py): a notification, a grant, a written or end notification, the sending
end's hello and choice, the receiving end's offer, as the other end of a bridge (a peer across the network) can send
them. The rule: any input decodes to a value that encodes back to the same bytes (the JSON ones: to bytes that decode
to the same value), or raises the protocol's own errors (`ProtocolError`, `PeerGone`), never anything else. See
docs/fuzzing.md:

    python3 -m venv /tmp/atheris && /tmp/atheris/bin/pip install atheris==3.0.0
    /tmp/atheris/bin/python fuzz/python/bridge_protocol.py -max_total_time=60 fuzz/python/corpus

The module is loaded from its file with `gpu_ipc._gpu_ipc` stood in for by its three exception classes, so neither
the native module nor a wheel is needed.
"""

from __future__ import annotations

import struct
import sys
import types
from pathlib import Path

import atheris

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "python" / "gpu_ipc"


def _load() -> tuple[types.ModuleType, types.ModuleType, types.ModuleType]:
    package = types.ModuleType("gpu_ipc")
    package.__path__ = [str(PACKAGE)]  # a namespace for the one module: the package's __init__ needs the native one
    native = types.ModuleType("gpu_ipc._gpu_ipc")

    class GpuIpcError(Exception):
        pass

    class Timeout(GpuIpcError):
        pass

    class EndOfStream(GpuIpcError):
        pass

    native.GpuIpcError, native.Timeout, native.EndOfStream = GpuIpcError, Timeout, EndOfStream
    sys.modules["gpu_ipc"], sys.modules["gpu_ipc._gpu_ipc"] = package, native
    import gpu_ipc.bridge_messages as bm
    import gpu_ipc.bridge_protocol as bp
    import gpu_ipc.bridge_receive as br

    # Every function of the modules (and of what they use: json, struct), for coverage.
    atheris.instrument_all()
    return bm, bp, br


bm, bp, br = _load()


class Mailbox:
    """A transport that hands over the fuzzer's notifications, one batch per receive."""

    def __init__(self, batches: list[list[bytes]]) -> None:
        self.batches = batches
        self.sent: list[bytes] = []

    def send(self, message: bytes) -> None:
        self.sent.append(message)

    def receive(self) -> list[bytes]:
        return self.batches.pop(0) if self.batches else []


def one_input(data: bytes) -> None:
    # Byte 0 picks what the notification is fed to; the rest is the notification.
    if not data:
        return
    which, message = data[0] % 5, data[1:]
    try:
        kind, body = bp.decode(message)
    except bp.ProtocolError:
        return
    assert bp.encode(kind, body) == message
    if which == 0:
        try:
            grant = bp.decode_grant(body)
        except bp.ProtocolError:
            return
        assert bp.encode_grant(grant) == bp.encode(bp.GRANT, body)
    elif which == 1:
        for s, what in ((bm._WRITTEN, "written"), (bm._END, "end")):
            try:
                fields = bm._unpack(s, body, what)
            except bp.ProtocolError:
                continue
            assert s.pack(*fields) == body
    elif which == 2:
        # The receiving end's first read: the sending end's hello (a layout the ring is made from).
        end = br.ReceivingEnd(Mailbox([[message]]), peer_timeout=60)
        try:
            layout = end.wait_hello(0.001)
        except (bp.ProtocolError, bp.PeerGone):
            return
        assert isinstance(layout, dict)
        assert all(isinstance(d, int) and d >= 0 for d in layout["shape"]), layout
        assert isinstance(layout["dtype"], str) and isinstance(layout["slots"], int) and layout["slots"] >= 1
        assert isinstance(layout["nbytes"], int) and layout["nbytes"] >= 0
    elif which == 4:
        # The receiving end's offer (the addresses and reach the sending end writes to), the sending end's choice.
        for decoder, encoder in ((bp.decode_offer, bp.encode_offer), (bp.decode_choice, bp.encode_choice)):
            try:
                value = decoder(body)
            except bp.ProtocolError:
                continue
            assert decoder(bp.decode(encoder(value))[1]) == value
    else:
        # Liveness: a failure report or a beat, whatever its body.
        live = bp.Liveness(Mailbox([[message]]), "the peer", beat_interval=60, peer_timeout=60)
        try:
            live.receive()
        except bp.PeerGone:
            pass


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
