"""How much do Table 4's statistics move with the seed alone?

    python benchmarks/table4_seed_spread.py [--seeds 5] [--semantics appendix-a]

Regenerates the 25 base datasets under several seeds and prints, per
operator and statistic, the range of log10|value| across seeds beside the
paper's value: the heavy-tailed extremes (div, mixed, mul) move by many
orders of magnitude between seeds, so a gap to the paper of that size is
sampling noise, not a different benchmark.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from procexec import config as config_module
from procexec.benchmark.executor import execute, parse_value, to_float
from procexec.benchmark.suite import expand_suite
from procexec.benchmark.table4 import PAPER_TABLE4, table4
from procexec.io.formats import format_sci
from procexec.records import OPERATORS


def _finals(job):
    seed, suite, semantics = job
    from procexec.benchmark.suite import generate_dataset

    finals = {op: [] for op in OPERATORS}
    for spec in expand_suite(suite, subset=False):
        if spec.lookback != 1:
            continue
        for example in generate_dataset(spec, suite.lengths, suite.examples_per_length, seed):
            ref = execute(example)
            value = ref.final if semantics == "default" else ref.appendix_a_final
            finals[spec.operator].append(to_float(parse_value(value)))
    return seed, table4(finals)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "config.yaml"))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--semantics", choices=["default", "appendix-a"], default="appendix-a")
    args = parser.parse_args()
    suite = config_module.load(args.config).suite
    seeds = [suite.seed + i for i in range(args.seeds)]
    with ProcessPoolExecutor() as pool:
        tables = dict(pool.map(_finals, [(s, suite, args.semantics) for s in seeds]))
    print(f"Table 4 over {len(seeds)} seeds ({args.semantics} semantics): min .. max across seeds, paper")
    for op in OPERATORS:
        cells = []
        for stat in ("median", "std", "min", "max"):
            values = [tables[s].loc[op, stat] for s in seeds]
            cells.append(
                f"{stat} {format_sci(min(values))} .. {format_sci(max(values))} (paper {format_sci(PAPER_TABLE4.loc[op, stat])})"
            )
        print(f"{op:6s} " + "; ".join(cells))


if __name__ == "__main__":
    main()
