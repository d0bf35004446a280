"""Run tests several times under a steady competing CPU load and count each test's failures.

    python tests/flake_hunt.py --rounds 3 -- -n 3 -m "slow or broker"
    python tests/flake_hunt.py --rounds 5 --load 2 -- tests/infra/test_elastic_processors.py

Timing races hide on a quiet machine and strike on a busy CI host: the load (`--load` busy-loop
processes, one per core by default, at the same priority as the tests) makes them show. Each round is
one pytest run with its own JUnit XML under `--out`; the table printed at the end gives every test that
failed at least once, how often, and the first failure's message. `--focus N` then runs only the tests
that failed N more rounds each, to tell a flake (fails sometimes) from a break (fails always).
It never reruns a failure to make it pass: a test that needs a rerun is a flake to fix.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUSY_LOOP = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    sum(range(100_000))\n"


@dataclass
class Tally:
    """Each test's runs, failures and the first failure's message, over all rounds."""

    runs: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)
    first_message: dict[str, str] = field(default_factory=dict)
    rounds: list[dict] = field(default_factory=list)

    def add(self, junit: Path) -> tuple[int, int]:
        """Count one round's JUnit XML in; its (tests, failures)."""
        tests = failed = 0
        for case in ET.parse(junit).getroot().iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            if case.find("skipped") is not None:
                continue
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            self.runs[name] += 1
            tests += 1
            if bad is not None:
                self.failures[name] += 1
                failed += 1
                self.first_message.setdefault(name, (bad.get("message") or bad.text or "").strip())
        return tests, failed


def busy(n: int) -> list[subprocess.Popen]:
    """`n` processes that keep a core each busy until stopped, or until this script dies."""
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(n)]


def one_round(index: int, pytest_args: list[str], load: int, out: Path, tally: Tally) -> None:
    junit = out / f"round-{index:02d}.xml"
    loaders = busy(load)
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}",
                               *pytest_args], cwd=ROOT)
    finally:
        for p in loaders:
            p.kill()
            p.wait()
    seconds = time.monotonic() - start
    tests, failed = tally.add(junit) if junit.exists() else (0, 0)
    row = {"round": index, "args": pytest_args, "load": load, "exit": done.returncode, "tests": tests,
           "failed": failed, "seconds": round(seconds, 1), "loadavg_after": os.getloadavg()[0]}
    tally.rounds.append(row)
    print(f"flake hunt: round {index}: {failed} of {tests} failed in {seconds:.0f} s "
          f"(pytest exit {done.returncode}, load average {row['loadavg_after']:.1f})", flush=True)


def node_ids(names: list[str]) -> list[str]:
    """JUnit's `tests.pkg.test_mod::test_x[p]` (or `…test_mod.Class::test_x`) as pytest node ids."""
    ids = []
    for name in names:
        dotted, test = name.split("::", 1)
        parts = dotted.split(".")
        module = next(i for i in range(len(parts), 0, -1) if (ROOT / Path(*parts[:i])).with_suffix(".py").exists())
        ids.append("::".join(["/".join(parts[:module]) + ".py", *parts[module:], test]))
    return ids


def options(pytest_args: list[str]) -> list[str]:
    """pytest's arguments without the selection (`-m`, `-k`, paths): what a focus round keeps (`-n 3`)."""
    kept, skip = [], False
    for arg in pytest_args:
        if skip or arg in ("-m", "-k"):
            skip = not skip
            continue
        if not arg.startswith(("-m", "-k")) and not any(c in arg for c in "/:") and not arg.endswith(".py"):
            kept.append(arg)
    return kept


def report(tally: Tally) -> str:
    lines = [f"{'failed':>6} {'runs':>4}  test  (first failure)"]
    for name, runs in sorted(tally.runs.items(), key=lambda kv: (-tally.failures[kv[0]], kv[0])):
        if tally.failures[name]:
            message = " ".join(tally.first_message[name].split())[:300]
            lines.append(f"{tally.failures[name]:>6} {runs:>4}  {name}\n{'':>13}{message}")
    flaky = sum(1 for n in tally.runs if 0 < tally.failures[n] < tally.runs[n])
    always = sum(1 for n in tally.runs if tally.failures[n] == tally.runs[n] > 1)
    once = sum(1 for n in tally.runs if tally.failures[n] == tally.runs[n] == 1)
    lines.append(f"{len(tally.runs)} tests, {sum(tally.runs.values())} runs, {sum(tally.failures.values())} failures: "
                 f"{flaky} failed sometimes, {always} in each of 2+ runs, {once} in their only run (--focus tells)")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="pytest runs of the whole selection")
    parser.add_argument("--load", type=int, default=os.cpu_count(), help="busy-loop processes beside the tests")
    parser.add_argument("--focus", type=int, default=0, help="then this many more rounds of the tests that failed")
    parser.add_argument("--out", type=Path, default=Path("flake-hunt"), help="JUnit XML and summary.json go here")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: pytest's arguments (selection, -n 3)")
    args = parser.parse_args()
    pytest_args = [a for a in args.pytest_args if a != "--"] if args.pytest_args[:1] == ["--"] else args.pytest_args
    args.out.mkdir(parents=True, exist_ok=True)
    tally = Tally()
    for i in range(1, args.rounds + 1):
        one_round(i, pytest_args, args.load, args.out, tally)
    failed = node_ids([n for n in tally.runs if tally.failures[n]])
    for i in range(args.rounds + 1, args.rounds + 1 + (args.focus if failed else 0)):
        one_round(i, [*failed, *options(pytest_args)], args.load, args.out, tally)
    text = report(tally)
    print(text)
    (args.out / "summary.json").write_text(json.dumps({
        "rounds": tally.rounds, "runs": dict(tally.runs), "failures": dict(tally.failures),
        "first_message": tally.first_message}, indent=1))
    return 1 if any(tally.failures.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
