"""Card for fill_overflow_half: masked_fill(-1e9) in float16."""

from harness.catalogue.card import Card, Verdict

CARD = Card(
    id="fill_overflow_half",
    title="masked_fill(-1e9) in float16",
    section="—",
    category="numerics",
    claim="Not named by the tutorial; the common belief: -1e9 is a safe mask value (the "
    "tutorial's own §4.2 snippet uses it).",
    trap="masked_fill(mask == 0, -1e9) on float16 scores.",
    truth=(
        "float16 tops out at 65504: masked_fill raises 'value cannot be converted to type "
        "c10::Half without overflow'. float32 and bfloat16 are fine."
    ),
    why="Code that works in float32 crashes when mixed precision is switched on.",
    avoid="Fill with float('-inf') or torch.finfo(scores.dtype).min.",
    expected=Verdict.NUMERIC,
    mask="causal",
    sources=("NVIDIA/apex#1052", "NVIDIA/apex#1105", "facebookresearch/fairseq#3575"),
)
