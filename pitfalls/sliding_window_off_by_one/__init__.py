"""Card for sliding_window_off_by_one: a sliding window that lets in one key too many."""

from types import ModuleType

from torch import nn

from harness.catalogue.card import MODERN, Card, Verdict
from harness.shapes import Shape

WINDOW = 3  # keys each query sees, itself included: less than the 8 tokens of the modern shape


def windowed(module: ModuleType, shape: Shape) -> nn.Module:
    """``Attention`` with a window of WINDOW keys and half as many K/V heads as query heads."""
    return module.Attention(shape.d_model, shape.heads, max(1, shape.heads // 2), window=WINDOW)


CARD = Card(
    id="sliding_window_off_by_one",
    title="A sliding window one key too wide",
    section="—",
    category="masks",
    claim=(
        "Not named by the tutorial; the common belief: a sliding window of w keeps the keys "
        "t - w .. t, as a window_size of (w, 0) does in FlashAttention."
    ),
    trap=(
        "The band is cut at t - w instead of t - w + 1 (triu(S - T - w) for triu(S - T - w + 1)):"
        " each query sees w + 1 keys, itself and w before it, where w in all were meant."
    ),
    truth=(
        "With w = 3 and 8 tokens, output t depends on inputs t - 3 .. t instead of t - 2 .. t from "
        "position 3 on, in the full forward and in decode alike (the band is anchored at the "
        "bottom-right, so the cache keeps the same mistake); the outputs differ from fixed.py's "
        "by up to 0.289 in float32 (the same in bfloat16 and float16). Shorter sequences (T <= w)"
        " are untouched."
    ),
    why=(
        "Implementations disagree on what w counts (w keys in all, or w before the query) and "
        "weights trained under one run under the other: a model that never saw token t - w now "
        "reads it, silently, and only past the window, which short tests never reach."
    ),
    avoid=(
        "Write down what w counts and convert at every boundary (FlashAttention's window_size is "
        "(w - 1, 0) for w keys); test which inputs each output depends on with T > w, in the "
        "full forward and through the cache."
    ),
    expected=Verdict.SILENT,
    mask="causal",
    convention="internal",
    sources=(
        "huggingface/transformers#29623",
        "vllm-project/vllm#3385",
        "huggingface/transformers#39408",
        "ml-explore/mlx-lm PR 390",
    ),
    **{**MODERN, "build": windowed},
)
