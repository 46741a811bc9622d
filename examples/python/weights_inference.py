"""An inference process that runs forward passes and moves to the trainer's newest weights between them.

    python examples/python/weights_trainer.py --socket /tmp/w.sock --steps 100
    python examples/python/weights_inference.py --socket /tmp/w.sock

The model's own tensors are loaded in place (``load_into``: the gather kernel on the current stream, pointers unchanged,
so a captured CUDA graph stays valid). The generation held is never half-updated: the trainer writes the next one
into another arena. When the trainer ends, ``latest()`` raises ``OwnerGone`` and this process stops, its model
intact. ``--no-copy`` reads the shared tensors directly instead (several readers on one GPU, one copy of the model).
"""

from __future__ import annotations

import argparse
import time

import torch

import gpu_ipc
import gpu_ipc.weights
from weights_trainer import make_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--socket", default="/tmp/gpu-ipc-weights.sock")
    parser.add_argument("--name", default="mlp")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--no-copy", action="store_true", help="run on the shared tensors themselves")
    args = parser.parse_args()

    model = make_model().to(args.device).eval()
    x = torch.randn(8, 256, device=args.device)
    with gpu_ipc.weights.open(args.socket, args.name, timeout=30) as reader:
        # On a GPU, where each of the model's tensors lives is read once: every generation is loaded into them.
        targets = reader.bind(model) if reader.backend != "host" and not args.no_copy else model

        def take() -> None:
            if args.no_copy:
                shared = {k: torch.from_dlpack(t) for k, t in reader.tensors().items()}
                model.load_state_dict(shared, assign=True)  # the parameters are the shared tensors
            else:
                reader.load_into(targets)  # copies into the model's own tensors

        take()
        while True:
            with torch.no_grad():
                y = model(x)
            print(f"generation {reader.generation}: output mean {y.mean().item():+.6f}", flush=True)
            try:
                if reader.latest() > reader.generation:
                    reader.refresh()
                    take()
                else:
                    reader.wait_for(reader.generation + 1, timeout=1.0)
            except gpu_ipc.Timeout:
                continue
            except gpu_ipc.OwnerGone:
                print("the trainer is gone; the model keeps the last generation it loaded", flush=True)
                break
            time.sleep(0.01)


if __name__ == "__main__":
    main()
