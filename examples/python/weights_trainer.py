"""A trainer that hands its weights to inference processes after every step (gpu_ipc.weights), with PyTorch.

    python examples/python/weights_trainer.py --socket /tmp/w.sock --steps 100
    python examples/python/weights_inference.py --socket /tmp/w.sock          # in another process, or several

Each step trains the model a little, then publishes its state_dict as a new generation: one device-to-device copy
into an arena no reader holds, no pickle, no per-tensor handles. Readers switch between forward passes when they
choose. ``--device cpu`` (``backend="host"``) runs without a GPU.
"""

from __future__ import annotations

import argparse
import time

import torch

import gpu_ipc.weights


def make_model() -> torch.nn.Module:
    """The model both sides build (the reader needs the same names and shapes)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 16)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--socket", default="/tmp/gpu-ipc-weights.sock")
    parser.add_argument("--name", default="mlp")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between steps")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    model = make_model().to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    backend = "host" if args.device == "cpu" else "vmm"
    with gpu_ipc.weights.publish(model.state_dict(), args.name, socket=args.socket, backend=backend) as pub:
        print(f"published {args.name} generation {pub.generation} at {args.socket}", flush=True)
        # On a GPU, where each parameter lives is read once (the optimizer writes them in place), so an update reads
        # nothing per tensor; on the host backend update() takes the module as it is.
        sources = pub.bind(model) if backend != "host" else model
        for step in range(args.steps):
            x = torch.randn(64, 256, device=args.device)
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            started = time.perf_counter()
            generation = pub.update(sources)  # waits for the copies, then publishes
            took = (time.perf_counter() - started) * 1e3
            holders = sorted({g for _pid, g in pub.readers()})
            print(f"step {step}: loss {loss.item():.4f}, generation {generation} in {took:.2f} ms; readers hold {holders}", flush=True)
            time.sleep(args.interval)


if __name__ == "__main__":
    main()
