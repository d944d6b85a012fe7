"""Card for packing_cross_document: packed documents get their own positions but no own mask."""

from harness.catalogue.card import MODERN, Card, Verdict

CARD = Card(
    id="packing_cross_document",
    title="Packed documents with their own positions but one causal mask",
    section="—",
    category="masks",
    claim=(
        "Not named by the tutorial; the common belief: restarting the positions at each packed "
        "document separates the documents, so the causal mask can stay as it is."
    ),
    trap=(
        "Sequences packed in one row get positions that restart at 0 at each document, but the "
        "mask stays causal over the whole row: a token attends to the documents packed before "
        "its own."
    ),
    truth=(
        "Measured on the packed scenario (two documents in each row, the second starting at a "
        "drawn position; B=2, T=8, 4 query heads, 2 K/V heads, seed 0): the first document is "
        "exact and the second is off by 0.689 in float32, bfloat16 and float16 alike (far "
        "above each dtype's rounding floor). Redrawing the first document (float64, three "
        "packed rows) "
        "moves the second's outputs by up to 0.560 in buggy.py and by 0.0 in fixed.py. Unpacked "
        "rows (the full and decode scenarios) are one document and stay within the floor."
    ),
    why=(
        "Packing is a training-time optimisation: the loss still falls, and the model learns to "
        "read unrelated documents as context, which it never has at inference."
    ),
    avoid=(
        "Derive document ids from the positions (or carry them with the batch) and block keys "
        "of other documents (a block-diagonal causal mask, or varlen kernels with cu_seqlens); "
        "test that changing one document leaves the others' outputs unchanged."
    ),
    expected=Verdict.SILENT,
    mask="causal",
    convention="internal",
    scenario="packed",
    sources=("huggingface/nanoVLM PR 204",),
    **{**MODERN, "doctor": {**MODERN["doctor"], "packed": True}},
)
