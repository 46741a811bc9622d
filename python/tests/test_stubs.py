"""The stubs are the documentation: the module's docstrings (what help() shows) are the stubs' own."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import gpu_ipc._gpu_ipc as native

STUB = Path(native.__file__).with_name("_gpu_ipc.pyi")


def test_runtime_docstrings_are_the_stubs() -> None:
    tree = ast.parse(STUB.read_text())
    checked = 0
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef) or cls.name not in (
            "Producer", "Slot", "Consumer", "Frame", "Semaphore", "SemaphoreWait", "SharedPool", "SharedBuffer",
            "PoolImporter", "BufferView", "Pattern", "Stamp",
        ):
            continue
        runtime = getattr(native, cls.name)
        assert inspect.getdoc(runtime) == ast.get_docstring(cls), cls.name
        for fn in cls.body:
            # Type slots (__next__, __iter__) carry CPython's own docstrings.
            if not isinstance(fn, ast.FunctionDef) or fn.name in ("__next__", "__iter__"):
                continue
            if doc := ast.get_docstring(fn):
                assert inspect.getdoc(getattr(runtime, fn.name)) == doc, f"{cls.name}.{fn.name}"
                checked += 1
    assert checked > 20
