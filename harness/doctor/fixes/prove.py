"""Fixes proven before they are shown: for each cause read at a line of the user's source, the
catalogue's fix rewritten into that line (``recipes``), run in place of the original code
(``live``) and diagnosed again with the same options and seed. A rewrite is shown only when
the trap it fixes is gone and no probe that passed fails; the causes after it are fixed on top
of it, so several fixes are proven together."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.doctor.causes import Cause
from harness.doctor.findings import FAIL, Diagnosis
from harness.doctor.fixes.line import Line
from harness.doctor.fixes.live import Owner, owners, recompiled, swapped
from harness.doctor.fixes.recipes import RECIPES
from harness.doctor.fixes.values import lines_run, steady, values_at
from harness.doctor.reading.checks import SCALES
from harness.doctor.reading.record import HARNESS, PROJECT, shown_path, source_file

MOST = 3  # fixes proven on top of each other, at most
EVERY = "with this change every probe passes"  # what a proof says of a whole fix
CANDIDATES = 8  # rewrites of one cause tried, at most (each costs a diagnosis)


@dataclass(frozen=True)
class Fix:
    """A change to one line of the user's file, and what diagnosing the changed code showed."""

    trap: str
    path: Path
    number: int  # the first line it changes
    before: tuple[str, ...]  # the lines it changes, as they are
    after: tuple[str, ...]  # those lines as the fix writes them
    proof: str  # "with this change every probe passes", or what still fails

    def text(self, indent: str = "") -> list[str]:
        where = f"{shown_path(str(self.path))}:{self.number}"
        return [
            f"{indent}fix ({self.trap}) at {where}, proven: {self.proof}",
            *(f"{indent}  - {line.strip()}" for line in self.before),
            *(f"{indent}  + {line.strip()}" for line in self.after),
        ]


def _changed(source: str, rewritten: str) -> tuple[int, tuple[str, ...], tuple[str, ...]]:
    """The first line a rewrite changes, and the lines it changes before and after (a call
    over several lines may change on any of them)."""
    old, new = source.splitlines(), rewritten.splitlines()
    first = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), 0)
    last_old, last_new = len(old), len(new)
    while last_old > first and last_new > first and old[last_old - 1] == new[last_new - 1]:
        last_old, last_new = last_old - 1, last_new - 1
    return first + 1, tuple(old[first:last_old]), tuple(new[first:last_new])


@dataclass
class Fixes:
    """The fixes proven, and each changed file's rewritten source."""

    fixes: list[Fix] = field(default_factory=list)
    sources: dict[Path, str] = field(default_factory=dict)
    originals: dict[Path, str] = field(default_factory=dict)
    looks: dict[str, str] = field(default_factory=dict)  # trap -> where to look, unfixed

    def onto(self, diagnosis: Diagnosis) -> None:
        """``diagnosis`` given these fixes; where one fix alone makes every probe pass, the
        failures no cause explained are shown under its cause, as what it brought about (a
        causal triangle a diagonal off leaks the padding too, and fails float16 with it)."""
        diagnosis.fixes, diagnosis.looks = self.fixes, self.looks
        if len(self.fixes) != 1 or self.fixes[0].proof != EVERY:
            return
        cause = next((c for c in diagnosis.causes if c.read and c.trap == self.fixes[0].trap), None)
        if cause is None:
            return
        explained = {probe for c in diagnosis.causes for probe in c.probes}
        more = tuple(f.probe for f in diagnosis.findings
                     if f.status == FAIL and f.probe not in explained)  # fmt: skip
        at = diagnosis.causes.index(cause)
        diagnosis.causes[at] = replace(cause, probes=cause.probes + more)

    def diff(self) -> str:
        """A unified diff of every changed file against the file as it is."""
        parts = []
        for path, source in self.sources.items():
            shown = shown_path(str(path))
            parts += difflib.unified_diff(
                self.originals[path].splitlines(keepends=True),
                source.splitlines(keepends=True),
                f"a/{shown}",
                f"b/{shown}",
            )
        return "".join(parts)


def _editable(path: Path) -> bool:
    """A file of the user's: not the doctor's own, not an installed package's."""
    resolved = path.resolve()
    installed = {"site-packages", "dist-packages"} & set(resolved.parts)
    return not resolved.is_relative_to(HARNESS) and not installed


def _named(cause: Cause) -> list[tuple[Path, int]]:
    """The editable source lines a cause names: where it is, then the lines it involves."""
    named = []
    for where in (cause.at, *cause.also):
        located = source_file(where) if where else None
        if located is not None and _editable(located[0]) and located not in named:
            named.append(located)
    return named


def _lines(named: list[tuple[Path, int]], sources: dict[Path, str]) -> list[tuple[Path, int]]:
    """The lines a cause names (``named``), then where what those lines read is made
    (``Line.origins``), one step only: a value made further back may be read on paths the
    probes never ran (a caller's mask reinterpreted where another branch reads it too), which
    no proof covers; ``sources``: the files as the fixes before have rewritten them."""
    read = {(path, n): Line(sources.get(path) or path.read_text(), n, {}) for path, n in named}
    found: list[tuple[Path, int]] = []
    for path, number in named:  # a value read on another line too: fixed where it is made first
        shared = read[path, number].shared_origins()
        found += [(path, n) for n in shared if (path, n) not in found]
        found += [(path, number)] if (path, number) not in found else []
    for path, number in named:
        for origin in read[path, number].origins():
            if (path, origin) not in found:
                found.append((path, origin))
    return found


def _failing(diagnosis: Diagnosis) -> set[str]:
    return {f.probe for f in diagnosis.findings if f.status == FAIL}


def _traps(diagnosis: Diagnosis) -> set[str]:
    named = {c.trap for c in diagnosis.causes if c.trap}
    return named | {t for f in diagnosis.findings if f.status == FAIL for t in f.traps}


def _proof(
    before: Diagnosis, after: Diagnosis, trap: str, changed: Callable[[str], bool]
) -> str | None:
    """What ``after`` shows of the change, or None when it is no fix of ``trap``: the trap
    still named, a probe that passed failing now, or probes still failing with no other trap
    named for them at a line that neither the cause nor the change touched (one probe may show
    two traps, the second only once the first is gone, as a float16 probe shows an overflowing
    product once its fill fits; a trap named where the cause was, or where the change is, is
    the same failure named again; failures no trap explains may be the fault half fixed, or
    moved: a combined mask inverted whole turns its padding right and its causal part wrong).
    ``changed(where)``: whether a source line is one the cause or the change touched."""
    failing_before, failing_after = _failing(before), _failing(after)
    if trap in _traps(after) or not failing_after <= failing_before or _blinded(before, after):
        return None
    if after.healthy:
        return EVERY
    left = [c.trap for c in after.causes if c.trap and c.at and not changed(c.at)]
    if not left:  # what still fails is no other trap's: half a fix, or the fault moved
        return None
    return f"this change fixes {trap}; still failing: {', '.join(dict.fromkeys(left))}"


# What the recorded forward shows of the attention's layout: a change after which it shows
# less has hidden the attention from the reading, not fixed it
LAYOUT_FACTS = frozenset({"attention", "keys' axis", "queries' axis", "softmax axis", "head width"})
# nor is a fix one that stops turning the queries and keys by position: no trap's fix does
KEPT_FACTS = LAYOUT_FACTS | {"rotary", "rotary before the projections"}


def _blinded(before: Diagnosis, after: Diagnosis) -> bool:
    """The reading of ``after`` lacks a fact of the attention's layout that ``before``'s had
    (the scores' axes moved where it cannot follow them): what it no longer names, it cannot
    be seen to have fixed."""
    read = {f.name for f in after.facts}
    return any(f.name in KEPT_FACTS and f.name not in read for f in before.facts)


def _touching(
    lines: list[tuple[Path, int]], path: Path, first: int, count: int
) -> Callable[[str], bool]:
    """Whether a source line (``file.py:34 `code```) is one the cause was named at or
    involves (``lines``), or one of the ``count`` lines of ``path`` from ``first`` that the
    change rewrote."""
    own = {(p.resolve(), n) for p, n in lines}

    def touches(where: str) -> bool:
        located = source_file(where)
        if located is None:
            return False
        at, number = located[0].resolve(), located[1]
        return (at, number) in own or (at == path.resolve() and 0 <= number - first < count)

    return touches


def propose(
    diagnosis: Diagnosis,
    rediagnose: Callable[[], Diagnosis],
    run: Callable[..., object] = lambda seq_len=None, unpadded=False: None,
    bare: Callable[[], object] | None = None,
    most: int = MOST,
) -> Fixes:
    """The fixes of ``diagnosis``'s causes, each proven by ``rediagnose`` (the same target
    built and diagnosed again, with the same options and seed) with the fixes before it;
    ``run(seq_len=None, unpadded=False)`` builds and calls it once, on the probes' length or
    on ``seq_len`` tokens (where a fix reads what its code's names are worth, at two lengths),
    with the probes' ordinary mask or one that pads nothing (the lines either runs are the
    lines a fix may change);
    ``bare`` calls it without a mask, which a fix must not break where the code takes it (the
    probes, given a mask convention, always pass one)."""
    found = Fixes()
    replaced: dict[int, tuple[Owner, object]] = {}
    current, tried = diagnosis, set()
    history = []  # what was written, swapped in and diagnosed before each fix found
    while len(found.fixes) < most:
        cause = next((c for c in current.causes if c.trap in RECIPES and c.trap not in tried), None)
        if cause is None:
            break
        tried.add(cause.trap)
        before = (dict(found.sources), dict(replaced), current)
        try:
            step = _first_proven(cause, current, found, replaced, (rediagnose, run, bare))
        except Exception:  # whatever the user's code or files do, a fix only ever adds
            step = None
        if step is not None:
            history.append(before)
            current = step
    # a wrong scale traded for another (a factor taken away, none put right) is a fix only
    # where a later one puts the scale right; left last, it is taken back
    while found.fixes and found.fixes[-1].trap in SCALES and _scales(current):
        found.fixes.pop()
        sources, replaced, current = history.pop()
        found.sources = sources
    for cause in diagnosis.causes:
        if cause.trap and cause.trap not in {f.trap for f in found.fixes}:
            found.looks.setdefault(cause.trap, look(cause.trap))
    return found


def _scales(diagnosis: Diagnosis) -> bool:
    """A cause of ``diagnosis`` is a wrong scale."""
    return any(c.trap in SCALES for c in diagnosis.causes)


def look(trap: str) -> str:
    """Where to look for the change a cause needs, where no fix of it was proven: the
    catalogue's pair of the trap, whose diff is the change (a cause with no line, or one
    whose fix spans code the record does not show, is not guessed at)."""
    pair = PROJECT / "pitfalls" / trap
    if not (pair / "fixed.py").is_file():
        return "no fix proven"
    shown = shown_path(str(pair))
    return f"no fix proven; the catalogue's change: diff {shown}/buggy.py {shown}/fixed.py"


def _root(trap: str, diagnosis: Diagnosis) -> float | None:
    """The size a scale's square root should be taken of: the head width the forward read,
    or, against a declared scale s, 1 / s ** 2 (None where neither is known)."""
    declared = diagnosis.config.scale
    if trap in ("wrong_scale", "missing_scale") and declared:
        return 1 / declared**2
    return float(diagnosis.head_width) if trap == "scale_d_model" and diagnosis.head_width else None


Runs = tuple[
    Callable[[], Diagnosis], Callable[..., object], Callable[[], object] | None
]  # (rediagnose, run, bare), as ``propose`` takes them
LONGER = 3  # tokens more than the probes', where a size is read a second time


def _runs(call: Callable[[], object], replaced: dict[int, tuple[Owner, object]]) -> bool:
    """Whether ``call`` runs with the ``replaced`` functions in place."""
    try:
        with swapped(list(replaced.values())):
            call()
    except Exception:
        return False
    return True


@dataclass(frozen=True)
class _Proven:
    """A rewrite of a cause that proved: the file, its rewritten source, the functions
    swapped in, the lines it changes, what the proof said and the diagnosis after it."""

    path: Path
    source: str
    trial: dict[int, tuple[Owner, object]]
    change: tuple[int, tuple[str, ...], tuple[str, ...]]
    proof: str
    after: Diagnosis


def _first_proven(
    cause: Cause, current: Diagnosis, found: Fixes, replaced: dict[int, tuple[Owner, object]],
    runs: Runs,
) -> Diagnosis | None:  # fmt: skip
    """The first rewrite of ``cause`` that proves and leaves none of the probes it explains
    failing, else the one that proved with the fewest probes left failing, recorded in
    ``found`` (and the rewritten code kept in ``replaced``); its diagnosis, or None when none
    proves. (A mask read in two places is fixed where it is made, not at one of them.)"""
    best = None
    for proven in _proven(cause, current, found, replaced, runs):
        if best is None or len(_failing(proven.after)) < len(_failing(best.after)):
            best = proven
        if not set(cause.probes) & _failing(proven.after):
            break
    if best is None:
        return None
    found.originals.setdefault(best.path, best.path.read_text())
    found.sources[best.path] = best.source
    replaced.update(best.trial)
    found.fixes.append(Fix(cause.trap or "", best.path, *best.change, best.proof))
    return best.after


def _proven(
    cause: Cause, current: Diagnosis, found: Fixes, replaced: dict[int, tuple[Owner, object]],
    runs: Runs,
) -> Iterator[_Proven]:  # fmt: skip
    """Each rewrite of ``cause`` that proves, at most ``CANDIDATES`` rewrites tried."""
    rediagnose, run, bare = runs
    trap = cause.trap or ""
    tries = 0
    named = _named(cause)
    ran: dict[Path, set[int]] = {}
    for path, number in _lines(named, found.sources):
        source = found.sources.get(path) or path.read_text()
        live = owners(path, number)
        if not live:
            continue
        if path not in ran:
            with swapped(list(replaced.values())):
                ran[path] = lines_run(path, run) | lines_run(path, lambda: run(unpadded=True))
        if ran[path] and not Line(source, number, {}).ran(ran[path]):
            continue  # a branch the probes' call never takes: no proof would cover it

        def values(expressions: list[str], path: Path = path, number: int = number) -> dict:
            longer = current.config.seq_len + LONGER
            with swapped(list(replaced.values())):
                first = values_at(path, number, expressions, run)
                second = values_at(path, number, expressions, lambda: run(seq_len=longer))
            return steady(first, second)  # a size that moves with the length is no width

        line = Line(source, number, live[0].function.__globals__, values,
                    current.config.d_model, _root(trap, current))  # fmt: skip
        for candidate in RECIPES[trap](line):
            if tries >= CANDIDATES:
                return
            tries += 1
            functions = [recompiled(o, candidate, path, number) for o in live]
            if any(f is None for f in functions):
                continue
            changed = {id(o.function): (o, f) for o, f in zip(live, functions, strict=True)}
            trial = {**replaced, **changed}
            try:
                with swapped(list(trial.values())):
                    after = rediagnose()
            except Exception:  # the rewrite broke the build or the doctor's run: no fix
                continue
            change = _changed(source, candidate)
            touched = _touching(named, path, change[0], len(change[1]))
            proof = _proof(current, after, trap, touched)
            if proof is None:
                continue
            if bare is not None and _runs(bare, replaced) and not _runs(bare, trial):
                continue  # it breaks a call without a mask, which the code as it is takes
            yield _Proven(path, candidate, trial, change, proof, after)
