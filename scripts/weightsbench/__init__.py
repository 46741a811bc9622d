"""The weights benchmark's modules (scripts/weights_bench.py is the command): shapes, child processes, rows, report."""
