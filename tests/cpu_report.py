"""`pytest --cpu-report FILE`: the CPU seconds of each test, its own process's and those of
the child processes it waited for, one JSON line per test (every worker appends to FILE,
emptied at the start), and a summary by file at the end. Wall-clock durations (`--durations`)
mislead under `make test`, whose three workers share two cores; CPU seconds add up to what the
suite costs.

    make test PYTEST_ADDOPTS="--cpu-report cpu.jsonl"
    python tests/cpu_report.py cpu.jsonl      # the summary again, or of an older file
"""

import collections
import json
import os
import resource
import sys
import time

import pytest


def pytest_addoption(parser):
    parser.addoption("--cpu-report", metavar="FILE", default=None,
                     help="write each test's CPU seconds (own process and waited-for "
                          "children) to FILE as JSON lines; print a summary by file")


def pytest_configure(config):
    path = config.getoption("--cpu-report")
    if path and not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller, before workers
        open(path, "w", encoding="utf-8").close()  # this run's lines only


def _cpu():
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = item.config.getoption("--cpu-report")
    if not path:
        yield
        return
    own, children, start = *_cpu(), time.perf_counter()
    yield  # setup (the session fixtures it is the first to need included), call, teardown
    own_after, children_after = _cpu()
    line = json.dumps({"test": item.nodeid, "own": round(own_after - own, 2),
                       "children": round(children_after - children, 2),
                       "wall": round(time.perf_counter() - start, 2),
                       "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")})
    with open(path, "a", encoding="utf-8") as report:  # one short write per line
        report.write(line + "\n")


def summary(path, top=15):
    """The summary of a report file: CPU seconds in all, and by file, heaviest first."""
    by_file, total, tests = collections.Counter(), 0.0, 0
    with open(path, encoding="utf-8") as report:
        for line in report:
            record = json.loads(line)
            seconds = record["own"] + record["children"]
            by_file[record["test"].split("::")[0]] += seconds
            total, tests = total + seconds, tests + 1
    lines = [f"CPU seconds of {tests} tests: {total:.0f} (own process + children); by file:"]
    lines += [f"{seconds:8.1f}  {name}" for name, seconds in by_file.most_common(top)]
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter, config):
    path = config.getoption("--cpu-report")
    if path and os.path.exists(path) and not os.environ.get("PYTEST_XDIST_WORKER"):
        terminalreporter.write_line(summary(path))


if __name__ == "__main__":
    print(summary(sys.argv[1], top=int(sys.argv[2]) if len(sys.argv) > 2 else 40))
