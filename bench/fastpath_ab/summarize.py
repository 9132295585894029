"""Pools the runs of one or more `measure.py --json` files into the README's
markdown table: per input and variant the median ns/message over all runs,
the best run, the spread (min..max, % of the median), and the median's
speedup over pure Python and over mypyc."""

from __future__ import annotations

import json
import statistics
import sys


def main(paths: list[str]) -> None:
    pooled: dict[str, dict[str, list[float]]] = {}
    for path in paths:
        with open(path) as f:
            for case, runs in json.load(f)["results"].items():
                for name, values in runs.items():
                    pooled.setdefault(case, {}).setdefault(name, []).extend(values)
    for case, runs in pooled.items():
        py = statistics.median(runs["python"])
        mypyc = statistics.median(runs["mypyc"])
        print(f"\n**{case}** ({len(runs['python'])} runs)\n")
        print("| variant | ns/msg median | best | spread | vs pure Python | vs mypyc |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for name, values in runs.items():
            med = statistics.median(values)
            lo, hi = min(values), max(values)
            print(f"| {name} | {med:.1f} | {lo:.1f} | {100 * (lo - med) / med:+.0f}..{100 * (hi - med) / med:+.0f}% "
                  f"| {py / med:.1f}x | {mypyc / med:.1f}x |")


if __name__ == "__main__":
    main(sys.argv[1:])
