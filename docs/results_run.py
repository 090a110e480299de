"""`make results TABLE=NAME [SEEDS="0 1 2"]`: reruns one table of the Results page.

Each seed's steps (docs/results_page.py's GROUPS) run in order as shell commands, each resuming
what a stopped run left; the eval JSON that the last writes is copied to
docs/results/<prefix>-seed<S>.json, once it carries its run record. `make docs` then renders
the table from the files. Nothing is transcribed: a run that fails copies nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from results_page import GROUPS


def rerun(name: str, seeds: tuple[int, ...], *, cwd: Path) -> list[Path]:
    """Run group `name`'s steps for each seed in `cwd`; the result files written."""
    group = GROUPS[name]
    written = []
    for seed in seeds:
        for step in group.steps:
            command = step.format(seed=seed)
            print(f"+ {command}", flush=True)
            subprocess.run(command, shell=True, check=True, cwd=cwd)
        output = cwd / group.output.format(seed=seed)
        results = json.loads(output.read_text())
        if "record" not in results:
            raise SystemExit(f"{output}: no run record, so not a result (cvae eval copies "
                             "the checkpoint's run record into its JSON)")
        target = group.result(seed)
        shutil.copyfile(output, target)
        print(f"results {name}, seed {seed}: {target}", flush=True)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make results", description=__doc__.split("\n")[0])
    parser.add_argument("table", choices=sorted(GROUPS), help="the group of docs/results_page.py")
    parser.add_argument("--seeds", default="", help="space-separated seeds (default: the group's)")
    args = parser.parse_args(argv)
    group = GROUPS[args.table]
    seeds = tuple(int(s) for s in args.seeds.split()) or group.seeds
    if group.cost:
        print(f"{args.table}: {len(seeds)} seed(s), each {group.cost}", flush=True)
    rerun(args.table, seeds, cwd=Path.cwd())
    return 0


if __name__ == "__main__":
    sys.exit(main())
