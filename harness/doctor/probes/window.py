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
    """Output t depends on inputs t - w + 1 .. t exactly (causal sliding window of w keys)."""
    window, source = subject.window, subject.window_source
    if window is None:
        return skipped(source)
    if not subject.config.causal and not subject.takes_mask:
        return skipped("a sliding window is probed on causal modules (--causal, or a mask)")
    if window > LONGEST:
        return skipped(
            f"a window of {window} ({source}) needs {window + BEYOND} tokens; build the module "
            f"with a small one to probe it (--init sliding_window=4, or its own name)"
        )
    cfg = subject.config
    seq_len = max(cfg.seq_len, window + BEYOND)
    if subject.context is not None and seq_len > subject.context:
        return skipped(f"a window of {window} needs {seq_len} tokens, beyond its context")
    x = subject.x(cfg.batch, seq_len, 43)
    keep = subject.ordinary_keep(cfg.batch, seq_len)
    allowed = subject.effective_keep(keep, cfg.batch, seq_len)  # (B, T, T), (T, T) or None
    wrong = []  # (t, inputs output t depends on, inputs it should depend on)
    for t in range(seq_len):
        grad = subject.grad_of(x, keep, lambda out, t=t: out[:, t])  # (B, T, d)
        if allowed is not None:  # sequences where query t has a key (not all padding)
            grad = grad[allowed.expand(cfg.batch, seq_len, seq_len)[:, t].any(-1)]
            if not len(grad):
                continue
        depends = grad.abs().amax(dim=(0, 2)) > 0  # (T,)
        seen = depends.nonzero().flatten().tolist()
        want = list(range(max(0, t - window + 1), t + 1))
        if seen != want:
            wrong.append((t, seen, want))
    if not wrong:
        return passed(f"output t depends exactly on inputs t-{window - 1}..t ({source})")
    t, seen, want = wrong[0]
    wider = all(s == [max(0, u - window), *w] for u, s, w in wrong)  # one key more, each time
    why = " (sliding_window_off_by_one: w + 1 keys)" if wider else ""
    return failed(
        f"output {t} depends on inputs {_span(seen)}, not {_span(want)} (window {window}, "
        f"{source}; {len(wrong)} of {seq_len} outputs wrong){why}"
    )


def _span(positions: list[int]) -> str:
    if not positions:
        return "none"
    if positions == list(range(positions[0], positions[-1] + 1)):
        return f"{positions[0]}..{positions[-1]}"
    return ", ".join(map(str, positions))
