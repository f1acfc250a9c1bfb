"""`elman <command>`: one entry point; each command lives in its own module, which
defines `add_arguments(parser)` and `main(args) -> int`."""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "parity": ("elman.harness.parity", "CUDA kernels against their fp64 references, every gradient"),
    "bench": ("elman.harness.bench", "kernel and layer benchmarks with baselines from the same run"),
    "warm": ("elman.harness.warm", "compile the baselines' Triton kernels in parallel before timing"),
    "data": ("elman.training.data", "build the default byte corpus or its test slice"),
    "train": ("elman.training.train", "train a byte-level LadderLM (the 10-minute protocol)"),
    "results": ("elman.results.training", "last-100 tables over training runs"),
    "dims": ("elman.training.dims", "parameter counts and 128-aligned widths for a target"),
    "sched": ("elman.training.sched", "run a job file, one job per GPU"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="elman", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    argv = sys.argv[1:] if argv is None else argv
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if argv and argv[0] == name:  # import only the command that runs
            importlib.import_module(module).add_arguments(p)
    args = parser.parse_args(argv)
    return int(importlib.import_module(COMMANDS[args.command][0]).main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
