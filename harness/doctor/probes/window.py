"""A sliding window: output t depends exactly on inputs (t - w, t], nothing older, nothing later.

The window is declared (``--window``) or read off the module (``sliding_window``,
``window_size``, ... on it or its config), and the finding says which. Dependency is exact: the
gradient of output t with respect to each input, in float64.
"""

from __future__ import annotations

from harness.doctor.findings import Outcome, failed, passed, skipped
from harness.doctor.probes.registry import probe
from harness.doctor.subject import Subject

BEYOND = 3  # tokens past the window in the probed sequence
LONGEST = 64  # the longest window probed: T backward passes of T tokens each


@probe("sliding window", compares=True)
def probe_window(subject: Subject) -> Outcome:
    """Output t depends on inputs t - w + 1 .. t exactly (causal sliding window of w keys); in a
    bidirectional module, on a band of one reach each side."""
    window, source = subject.window, subject.window_source
    if window is None:
        return skipped(source)
    if not subject.config.causal and not subject.takes_mask and not subject.reach.two_sided:
        return skipped("a sliding window is probed on causal modules (--causal, or a mask)")
    if window > LONGEST:
        return skipped(
            f"a window of {window} ({source}) needs {window + BEYOND} tokens; build the module "
            f"with a small one to probe it (--init sliding_window=4, or its own name)"
        )
    if not subject.config.causal and subject.reach.two_sided:
        return _bidirectional(subject, window, source)
    seq_len = max(subject.config.seq_len, window + BEYOND)
    if subject.context is not None and seq_len > subject.context:
        return skipped(f"a window of {window} needs {seq_len} tokens, beyond its context")
    wrong = []  # (t, inputs output t depends on, inputs it should depend on)
    for t, seen in enumerate(subject.depends(seq_len)):
        want = list(range(max(0, t - window + 1), t + 1))
        if seen and seen != want:  # none: every sequence pads query t out
            wrong.append((t, seen, want))
    if not wrong:
        return passed(f"output t depends exactly on inputs t-{window - 1}..t ({source})")
    t, seen, want = wrong[0]
    wider = all(s == [max(0, u - window), *w] for u, s, w in wrong)  # one key more, each time
    dropped = all(s == list(range(u + 1)) for u, s, w in wrong)  # everything up to t
    why = " (sliding_window_off_by_one: w + 1 keys)" if wider else ""
    if dropped:
        why = (
            " (sliding_window_off_by_one: the window not applied on this path, a causal mask only)"
        )
    return failed(
        f"output {t} depends on inputs {_span(seen)}, not {_span(want)} (window {window}, "
        f"{source}; {len(wrong)} of {seq_len} outputs wrong){why}",
        *(("sliding_window_off_by_one",) if why else ()),
    )


def _bidirectional(subject: Subject, window: int, source: str) -> Outcome:
    """A bidirectional window: every output depends exactly on the inputs within the reach its
    middle output shows, on both sides. The reach is reported, not held to ``window``: whether
    w counts keys each side or in all differs between models."""
    reach = subject.reach
    if not reach.depends:
        return skipped(f"a window of {window} needs {reach.seq_len} tokens, beyond its context")
    middle = reach.seq_len // 2
    if reach.radius is None:
        return failed(
            f"a bidirectional module (window {window}, {source}): output {middle} depends on "
            f"inputs {_span(reach.depends[middle])}, not the same reach each side: a window "
            "built for a decoder (one-sided or uneven) where both sides were meant"
        )
    r, last = reach.radius, reach.seq_len - 1
    for t, seen in enumerate(reach.depends):
        want = list(range(max(0, t - r), min(last, t + r) + 1))
        if seen and seen != want:
            return failed(
                f"a bidirectional module (window {window}, {source}): output {t} depends on "
                f"inputs {_span(seen)}, not {_span(want)}, the reach of {r} each side that "
                f"output {middle} shows"
            )
    return passed(
        f"bidirectional: output t depends exactly on inputs t-{r}..t+{r} (window {window}, "
        f"{source}; how far each side is reported, not judged: conventions differ)"
    )


def _span(positions: list[int]) -> str:
    if not positions:
        return "none"
    if positions == list(range(positions[0], positions[-1] + 1)):
        return f"{positions[0]}..{positions[-1]}"
    return ", ".join(map(str, positions))
