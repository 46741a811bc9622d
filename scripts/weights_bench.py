"""Model weights between processes on a GPU: gpu_ipc.weights against torch.multiprocessing and a hand-made bucket.

Run on the GPU machine with the wheel installed (any python3 that imports torch and gpu_ipc):
    python scripts/weights_bench.py run OUT_DIR [--backend vmm|legacy|both] [--sets llama8b,moe] [--switches 1000]
                                                [--kills 10] [--container] [--quick] [--cold-repeats 3]
What one run measures, in this order (each part's rows go to OUT_DIR/weights.jsonl as they finish):
  cold      for each state_dict shape (`llama8b`: the 291 bf16 tensors of Llama-3-8B, about 16 GB; `moe`: 48 layers x
            128 experts x 3 expert matrices plus attention, about 18,800 bf16 tensors, expert sizes scaled so two
            generations fit) and each method, a fresh reader process (CUDA already set up before the clock starts)
            gets every tensor as a torch tensor: `gpu-ipc` (gpu_ipc.weights.open + tensors(torch): every tensor cut
            from one DLPack import of the arena), `gpu-ipc-per-tensor` (open + torch.from_dlpack of each tensor's
            view), `torch-mp` (one CUDA IPC handle per tensor, torch.multiprocessing's reduce_tensor as the RL
            frameworks and vLLM's IPC transfer use it), `bucket` (the tensors copied into one flat buffer, one
            handle, views made by offsets). Every tensor's exact checksum (its bits summed as integers) is checked
            in the reader: 0 wrong tensors expected. gpu-ipc, torch-mp and bucket take `--cold-repeats` fresh readers
            each (default 3): the median is reported with the range, and the ratios of the medians with theirs.
  switch    moving to the next generation: the owner's `update()` of every tensor (new random bytes; the gather
            kernel), the reader's `refresh()` + tensors(torch), against the goal's reference, one device-to-device
            memcpy of the same total bytes, and torch's own copy per tensor; the reader checks the new
            generation's checksums. Then the owner that makes its tensors in the arena (stage(torch), its own
            writes there, commit: no copy), beside the same writes into private tensors.
  memory    after each shape's part (its publisher closed, its readers gone, torch's cache and its CUDA IPC
            blocks collected), the GPU's free memory must be back where it started (within 512 MiB).
  mixed     `--switches` generations published back to back while a reader refreshes and checks, on every refresh,
            that every tensor holds its generation's value: mixed-generation reads counted (0 expected).
  kills     `--kills` trials: an owner process publishes 1 GiB and is SIGKILLed while a reader holds generation 1;
            the reader's time to be told (latest() raising OwnerGone), its tensors checked after the death, and the
            GPU's free memory seen by the reader back to its level before the owner started once it closes.
            With --container the reader runs in its own PID, IPC, network and mount namespaces with a private
            /dev/shm (unshare, root), only the socket shared.
Writes OUT_DIR/weights.md (tables, device, date, commit from GPU_IPC_COMMIT, stage/COMMIT or git, the run's time),
weights.jsonl.
Expected to take under 5 minutes on an H200 with the defaults and --backend both (not timed yet: the report says
how long the run took; most of it is starting reader processes and making random weights).
Modules: scripts/weightsbench/ (shapes, children: the reader/owner processes, rows: the parts, report).
Exit status: 0 when every check passed (0 wrong tensors, 0 mixed reads, kills told within 1 s with tensors intact and
memory back), 1 otherwise. The goals are printed beside the figures (met or not), never asserted.
"""


from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

from weightsbench.children import kill_reader_main, mixed_reader_main, owner_main, reader_main, say
from weightsbench.report import device_facts, report
from weightsbench.rows import Run, part_cold_and_switch, part_kills, part_mixed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)
    p = sub.add_parser("run", help="the whole benchmark")
    p.add_argument("out")
    p.add_argument("--backend", default="both", choices=["legacy", "vmm", "both"])
    p.add_argument("--sets", default="llama8b,moe")
    p.add_argument("--switches", type=int, default=1000)
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--container", action="store_true", help="also run the kill trials with the reader in a container")
    p.add_argument("--quick", action="store_true", help="every tensor at most 1 Mi elements (checks the script)")
    p.add_argument("--cold-repeats", type=int, default=3,
                   help="fresh readers per cold method (gpu-ipc, torch-mp, bucket): the tables give the median and "
                        "the range (default 3)")
    sub.add_parser("_reader")
    m = sub.add_parser("_mixed_reader")
    m.add_argument("socket")
    m.add_argument("last")
    o = sub.add_parser("_owner")
    o.add_argument("socket")
    o.add_argument("--gib", default="1")
    k = sub.add_parser("_kill_reader")
    k.add_argument("socket")
    args = parser.parse_args()
    if args.role == "_reader":
        return reader_main(args)
    if args.role == "_mixed_reader":
        return mixed_reader_main(args)
    if args.role == "_owner":
        return owner_main(args)
    if args.role == "_kill_reader":
        return kill_reader_main(args)
    args.passthrough = sys.argv[3:]
    os.makedirs(args.out, exist_ok=True)
    run = Run(args.out, args)
    facts = device_facts()
    say(json.dumps(facts))
    backends = ["vmm", "legacy"] if args.backend == "both" else [args.backend]
    for backend in backends:
        for set_name in [s for s in args.sets.split(",") if s]:
            try:
                part_cold_and_switch(run, backend, set_name)
            except Exception as e:  # noqa: BLE001 - one set's failure is recorded and the others still run
                run.fail(f"{set_name} {backend}: {type(e).__name__}: {e}")
        try:
            part_mixed(run, backend)
        except Exception as e:  # noqa: BLE001
            run.fail(f"mixed {backend}: {type(e).__name__}: {e}")
    if args.kills:
        part_kills(run, backends[0], container=False)
        if args.container:
            part_kills(run, backends[0], container=True)
    report(run, facts)
    shutil.rmtree(run.tmp, ignore_errors=True)
    return 0 if not run.failures else 1


if __name__ == "__main__":
    sys.exit(main())
