"""A curated mutation check: each mutant is one fault put into the code; a test must catch it.

    python .ci/mutants.py                 # every mutant in .ci/mutants/*.toml
    python .ci/mutants.py --only metrics  # mutants whose file name contains "metrics"
    python .ci/mutants.py --set hostile   # the mutants of .ci/mutants/hostile.toml
    python .ci/mutants.py --markdown      # the closing table: fault, file, test that catches it

Each mutant names a file, a snippet that must occur exactly once, its replacement, and the tests
that must fail with it. The mutants are applied one at a time to a copy of the working tree (the
tree itself is never touched) and the named tests run there with the project's interpreter. The
run fails when a mutant survives, when its snippet is missing (the code moved on: update the
mutant), or when its tests already fail on the unmutated copy.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / ".ci" / "mutants"
COPIED = ("harness", "pitfalls", "tests", "conftest.py", "pyproject.toml", "README.md", "reports")
TIMEOUT = 600


@dataclass(frozen=True)
class Mutant:
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    fault: str

    @property
    def label(self) -> str:
        return f"{self.file}: {self.fault}"


def load(only: str | None, group: str | None = None) -> list[Mutant]:
    mutants = []
    for path in sorted(MUTANTS.glob(f"{group or '*'}.toml")):
        for entry in tomllib.loads(path.read_text())["mutant"]:
            tests = tuple(entry["tests"])
            mutant = Mutant(entry["file"], entry["find"], entry["replace"], tests, entry["fault"])
            if only is None or only in mutant.file:
                mutants.append(mutant)
    return mutants


def pytest(tree: Path, tests: tuple[str, ...]) -> int:
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        done = subprocess.run(command, cwd=tree, capture_output=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return -1  # a hang is caught too: the test did not pass
    return done.returncode


def check(mutant: Mutant, tree: Path) -> str:
    """``killed``, ``SURVIVED``, ``MISSING`` (snippet not found once) or ``BROKEN`` (tests fail
    without the mutant)."""
    path = tree / mutant.file
    original = path.read_text()
    if original.count(mutant.find) != 1:
        return "MISSING"
    if pytest(tree, mutant.tests) != 0:
        return "BROKEN"
    try:
        path.write_text(original.replace(mutant.find, mutant.replace))
        code = pytest(tree, mutant.tests)
    finally:
        path.write_text(original)
    if code in (4, 5):  # usage error or no tests collected: the mutant proves nothing
        return "BROKEN"
    return "killed" if code != 0 else "SURVIVED"


def markdown(mutants: list[Mutant], results: list[str] | None = None) -> str:
    lines = ["| # | file | fault | caught by | result |", "|---|---|---|---|---|"]
    for i, m in enumerate(mutants, start=1):
        result = results[i - 1] if results else ""
        tests = "<br>".join(f"`{t}`" for t in m.tests)
        lines.append(f"| {i} | `{m.file}` | {m.fault} | {tests} | {result} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="only mutants whose file path contains this")
    parser.add_argument("--set", help="only the mutants of .ci/mutants/SET.toml")
    parser.add_argument("--markdown", action="store_true", help="print the table, run nothing")
    args = parser.parse_args()
    mutants = load(args.only, args.set)
    if args.markdown:
        print(markdown(mutants))
        return 0
    results = []
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        tree = Path(tmp)
        for name in COPIED:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(source, tree / name)
        for i, mutant in enumerate(mutants, start=1):
            result = check(mutant, tree)
            results.append(result)
            print(f"[{i}/{len(mutants)}] {result:<8} {mutant.label}", flush=True)
    print(markdown(mutants, results))
    bad = [r for r in results if r != "killed"]
    print(f"{len(results) - len(bad)}/{len(results)} mutants killed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
