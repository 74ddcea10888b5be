"""Draw a run's memory timeline and write a self-contained HTML report from its memfit log.

The source is a workdir (its memory.jsonl is read) or a log file. By default a workdir
gets WORKDIR/report.html and WORKDIR/timeline.png; a log NAME.jsonl gets NAME.report.html
and NAME.timeline.png beside it. With -o OUT.html, the PNG is OUT.png beside it.

examples:
  memfit report runs/exp1
  memfit report runs/exp1/memory.jsonl -o reports/exp1.html
  memfit report watch.jsonl -o reports/
"""

from __future__ import annotations

import argparse

from memfit.report import write_report

NAME = "report"
HELP = "plot a memfit log's memory timeline and write an HTML report"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("source", metavar="WORKDIR|LOG", help="a run's workdir or a memfit log file")
    p.add_argument("-o", "--output", metavar="OUT.html",
                   help="the HTML file (or a directory) to write; the PNG goes beside it")


def run(args: argparse.Namespace) -> int:
    result = write_report(args.source, args.output)
    print(f"wrote {result.html}")
    print(f"wrote {result.png}")
    for line in result.headline.splitlines():
        print(f"verdict: {line}")
    if result.doctor:
        print(result.doctor)
    return 0
