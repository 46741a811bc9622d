#!/usr/bin/env python3
"""Compiles kernels/cuda/*.cu with NVRTC (through ctypes) into the images gpu-ipc embeds.

Called by scripts/gen-kernels.sh, which fetches the pinned NVRTC wheel and passes its library path. Four
programs, into one tree (--out, kernels/images/), a folder each, each written as one cubin per architecture in
CUBIN_ARCHS, one PTX for PTX_ARCH, and manifest.json describing them (the crates embed a folder with the one table,
gpu_ipc_driver::kernel_images!, whose architectures are these):
  - kernels/: the gpu-ipc-kernels crate's program, every kernels/cuda/*.cu but ring_*.cu, queue_*.cu, weights_*.cu;
  - ring/: the ring's own kernels, kernels/cuda/ring_*.cu, which ipc-core embeds (ipc-core cannot depend on the
    kernels crate, which depends on it, and a ring need not load the kernels crate's larger program);
  - queue/: the work queue's kernels for the CPU side, kernels/cuda/queue_*.cu, which ipc-toolkit embeds;
  - weights/: the weights' gather copy, kernels/cuda/weights_*.cu, which ipc-toolkit embeds.
The headers kernels/cuda/*.cuh are given to NVRTC by name, so a source's `#include "NAME.cuh"` finds them as nvcc
would next to the file; a program's manifest lists the headers its sources include.
Python 3.11 standard library only. The output is byte-for-byte deterministic: no paths, times or host names go
into the programs or the manifests.
"""

import argparse
import ctypes
import hashlib
import json
import pathlib
import re
import sys

CUBIN_ARCHS = ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"]
PTX_ARCH = "compute_75"
# NVRTC's defaults already optimise fully (the equivalent of nvcc -O3); --dopt=on says so explicitly. No
# -lineinfo and no -G: the images carry no source paths or debug sections.
COMMON_FLAGS = ["--std=c++17", "--dopt=on"]
# The names NVRTC records for the translation units; fixed so the output does not depend on the checkout path.
PROGRAM_NAME = "gpu_ipc_kernels.cu"
RING_PROGRAM_NAME = "gpu_ipc_ring_kernels.cu"
# Sources of the ring's program (kernels/cuda/ring_*.cu) and of the work queue's (queue_*.cu); every other .cu
# belongs to the kernels crate's.
RING_PREFIX = "ring_"
QUEUE_PREFIX = "queue_"
QUEUE_PROGRAM_NAME = "gpu_ipc_queue_kernels.cu"
WEIGHTS_PREFIX = "weights_"
WEIGHTS_PROGRAM_NAME = "gpu_ipc_weights_kernels.cu"
# A source's include of one of the project's headers.
INCLUDE_RE = re.compile(rb'^#include "([\w.]+\.cuh)"', re.MULTILINE)
# The kernels, read from the PTX the compiler made (so kernels that a macro defines are listed too).
ENTRY_RE = re.compile(rb"^\.visible \.entry (\w+)\(", re.MULTILINE)

NVRTC_SUCCESS = 0


class NvrtcError(Exception):
    """An NVRTC call failed; the message names the call, the result and, for compiles, the log."""


class Nvrtc:
    """The few NVRTC entry points the generator calls, loaded from one library file."""

    def __init__(self, path: str):
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as e:
            raise NvrtcError(f"cannot load NVRTC from {path}: {e}") from e
        lib = self.lib
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
        lib.nvrtcVersion.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
        lib.nvrtcCreateProgram.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_char_p),
            ctypes.POINTER(ctypes.c_char_p),
        ]
        lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.nvrtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        for size_fn, get_fn in [
            ("nvrtcGetProgramLogSize", "nvrtcGetProgramLog"),
            ("nvrtcGetCUBINSize", "nvrtcGetCUBIN"),
            ("nvrtcGetPTXSize", "nvrtcGetPTX"),
        ]:
            getattr(lib, size_fn).argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
            getattr(lib, get_fn).argtypes = [ctypes.c_void_p, ctypes.c_char_p]

    def check(self, call: str, result: int) -> None:
        if result != NVRTC_SUCCESS:
            name = self.lib.nvrtcGetErrorString(result)
            raise NvrtcError(f"{call} failed: {name.decode() if name else 'unknown'} ({result})")

    def version(self) -> str:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.check("nvrtcVersion", self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)))
        return f"{major.value}.{minor.value}"

    def _read(self, prog, size_fn: str, get_fn: str) -> bytes:
        size = ctypes.c_size_t()
        self.check(size_fn, getattr(self.lib, size_fn)(prog, ctypes.byref(size)))
        buf = ctypes.create_string_buffer(size.value)
        self.check(get_fn, getattr(self.lib, get_fn)(prog, buf))
        return buf.raw

    def compile(self, source: bytes, name: str, flags: list[str], kind: str, headers: dict[str, bytes]) -> bytes:
        """Compiles one program with `headers` (include name -> text); returns the cubin, or the PTX without its
        terminating NUL."""
        prog = ctypes.c_void_p()
        texts = (ctypes.c_char_p * len(headers))(*headers.values())
        names = (ctypes.c_char_p * len(headers))(*[n.encode() for n in headers])
        self.check(
            "nvrtcCreateProgram",
            self.lib.nvrtcCreateProgram(ctypes.byref(prog), source, name.encode(), len(headers), texts, names),
        )
        try:
            argv = (ctypes.c_char_p * len(flags))(*[f.encode() for f in flags])
            result = self.lib.nvrtcCompileProgram(prog, len(flags), argv)
            if result != NVRTC_SUCCESS:
                log = self._read(prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog").rstrip(b"\0")
                name = self.lib.nvrtcGetErrorString(result).decode()
                raise NvrtcError(
                    f"nvrtcCompileProgram failed with {name} for flags {' '.join(flags)}:\n{log.decode(errors='replace')}"
                )
            if kind == "cubin":
                return self._read(prog, "nvrtcGetCUBINSize", "nvrtcGetCUBIN")
            return self._read(prog, "nvrtcGetPTXSize", "nvrtcGetPTX").rstrip(b"\0")
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def translation_unit(root: pathlib.Path, sources: list[pathlib.Path]) -> bytes:
    """All sources in one program, so each architecture is one module; #line keeps compiler messages exact."""
    parts = []
    for src in sources:
        rel = src.relative_to(root).as_posix()
        parts.append(f'#line 1 "{rel}"\n'.encode() + src.read_bytes() + b"\n")
    return b"".join(parts)


def included_headers(root: pathlib.Path, sources: list[pathlib.Path]) -> list[pathlib.Path]:
    """The headers of kernels/cuda/ that `sources` (or those headers) include, in name order."""
    found: set[pathlib.Path] = set()
    todo = list(sources)
    while todo:
        for include in INCLUDE_RE.findall(todo.pop().read_bytes()):
            header = root / "kernels" / "cuda" / include.decode()
            if header not in found and header.is_file():
                found.add(header)
                todo.append(header)
    return sorted(found)


def build(
    nvrtc: Nvrtc, root: pathlib.Path, sources: list[pathlib.Path], name: str, out: pathlib.Path, toolchain: dict
) -> None:
    """Compiles `sources` as one program named `name` for every architecture; writes the images and the manifest."""
    program = translation_unit(root, sources)
    header_files = included_headers(root, sources)
    headers = {h.name: h.read_bytes() for h in header_files}
    jobs = [(arch, "cubin", f"{arch}.cubin") for arch in CUBIN_ARCHS]
    jobs.append((PTX_ARCH, "ptx", f"{PTX_ARCH}.ptx"))
    images = []
    kernels = []
    out.mkdir(parents=True, exist_ok=True)
    for arch, kind, file in jobs:
        flags = [f"--gpu-architecture={arch}", *COMMON_FLAGS]
        data = nvrtc.compile(program, name, flags, kind, headers)
        if kind == "ptx":
            kernels = sorted(entry.decode() for entry in ENTRY_RE.findall(data))
        (out / file).write_bytes(data)
        images.append(
            {"file": file, "kind": kind, "arch": arch, "flags": flags, "size": len(data), "sha256": sha256(data)}
        )
    manifest = {
        "generator": "scripts/gen-kernels.sh",
        "toolchain": toolchain,
        "program_name": name,
        "common_flags": COMMON_FLAGS,
        "sources": [
            {"file": src.relative_to(root).as_posix(), "sha256": sha256(src.read_bytes())}
            for src in [*sources, *header_files]
        ],
        "kernels": kernels,
        "images": images,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    for image in images:
        print(f"gen_kernels: {name}: {image['file']:<16} {image['size']:>7} bytes", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nvrtc", required=True, help="path of libnvrtc.so.12")
    parser.add_argument("--package", required=True, help="pip spec of the NVRTC wheel, for the manifest")
    parser.add_argument("--wheel", required=True, help="file name of the NVRTC wheel, for the manifest")
    parser.add_argument("--wheel-sha256", required=True, help="sha256 of the NVRTC wheel, for the manifest")
    parser.add_argument("--root", required=True, type=pathlib.Path, help="repository root")
    parser.add_argument("--out", required=True, type=pathlib.Path, help="the images tree: a folder per program")
    args = parser.parse_args()

    root = args.root.resolve()
    every = sorted((root / "kernels" / "cuda").glob("*.cu"))
    sources = [src for src in every if not src.name.startswith((RING_PREFIX, QUEUE_PREFIX, WEIGHTS_PREFIX))]
    ring_sources = [src for src in every if src.name.startswith(RING_PREFIX)]
    queue_sources = [src for src in every if src.name.startswith(QUEUE_PREFIX)]
    weights_sources = [src for src in every if src.name.startswith(WEIGHTS_PREFIX)]
    programs = [("kernel", sources), (f"{RING_PREFIX}*", ring_sources), (f"{QUEUE_PREFIX}*", queue_sources),
                (f"{WEIGHTS_PREFIX}*", weights_sources)]
    for what, found in programs:
        if not found:
            print(f"gen_kernels: no {what} .cu sources under {root / 'kernels' / 'cuda'}", file=sys.stderr)
            return 1

    try:
        nvrtc = Nvrtc(args.nvrtc)
        toolchain = {
            "compiler": "NVRTC",
            "package": args.package,
            "wheel": args.wheel,
            "wheel_sha256": args.wheel_sha256,
            "nvrtc_version": nvrtc.version(),
        }
        build(nvrtc, root, sources, PROGRAM_NAME, args.out / "kernels", toolchain)
        build(nvrtc, root, ring_sources, RING_PROGRAM_NAME, args.out / "ring", toolchain)
        build(nvrtc, root, queue_sources, QUEUE_PROGRAM_NAME, args.out / "queue", toolchain)
        build(nvrtc, root, weights_sources, WEIGHTS_PROGRAM_NAME, args.out / "weights", toolchain)
    except NvrtcError as e:
        print(f"gen_kernels: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
