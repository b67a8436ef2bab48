"""The accelerator benchmark script builds valid ``python -m e3j bench`` command lines."""

import argparse
import runpy
import shlex
from pathlib import Path

from e3j._sweep import add_parser

ROOT = Path(__file__).resolve().parents[2]


def test_paper_sizes_commands_parse(capsys):
    script = runpy.run_path(str(ROOT / "benchmarks/paper_sizes.py"))
    assert script["main"](["--dry-run", "--runs", "7"]) == 0
    commands = [line[2:] for line in capsys.readouterr().out.splitlines() if line.startswith("+ ")]
    assert len(commands) == 2 + 10  # fig1, fig2, and table1's 5 channel counts x 2 lmax
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    table1 = []
    for cmd in commands:
        argv = shlex.split(cmd)
        assert argv[1:4] == ["-m", "e3j", "bench"]
        args = parser.parse_args(argv[3:])
        assert args.runs == 7 and args.json.endswith(".json")
        if "table1" in args.json:
            table1.append((args.lmax[0], args.channels[0], args.sizes[0]))
    # paper Table 1: N * C = 2^22 at lmax 2 and 2^21 at lmax 3, 45 neighbours
    assert {(l, c, n * c) for l, c, n in table1} == {
        (l, c, 2**24 // 2**l) for l in (2, 3) for c in (64, 128, 256, 512, 1024)
    }
