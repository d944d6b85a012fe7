"""Card for rope_pairing_mismatch: interleaved rotary pairs on weights laid out half-split."""

from harness.catalogue.card import MODERN, Card, Verdict

CARD = Card(
    id="rope_pairing_mismatch",
    title="Interleaved rotary pairs on weights laid out for half-split pairs",
    section="—",
    category="positions",
    claim=(
        "Not named by the tutorial; the common belief: rotary embedding is one formula, so any "
        "implementation of it (Meta's complex numbers, Hugging Face's rotate_half) fits any "
        "checkpoint."
    ),
    trap=(
        "rotary rotates dimension 2i with 2i + 1 (interleaved, GPT-J/Meta) while the weights are "
        "laid out for dimension i with i + d/2 (half-split, rotate_half, GPT-NeoX/Hugging Face): "
        "the right frequencies turn the wrong pairs of coordinates."
    ),
    truth=(
        "Both pairings are valid rotary embeddings: with either, q·k depends on the relative "
        "position only (shifting every position by 1,000 changes either file's outputs by "
        "rounding only), and either is the other after one fixed permutation of each head's "
        "rows of W_q and W_k (Hugging Face's Llama conversion applies it to Meta's weights). "
        "Nothing in the "
        "module tells which is right; only weights laid out for one of them do. On the same "
        "weights (full scenario, float32, 4 heads of width 8, 8 tokens) the outputs differ by "
        "0.120 (relative L2 0.149) and the attention logits by up to 1.68, where the largest "
        "logit is 1.29; about the same in bfloat16 and float16. CATALOGUE.md's 'logits differ "
        "by up to 33' is not what this module gives: its logits stay within 1.3."
    ),
    why=(
        "Meta's original weights under Hugging Face code (or converted weights under Meta's "
        "code) run without an error and give fluent-looking but wrong text; every shift or swap "
        "test passes, since both pairings are relative."
    ),
    avoid=(
        "Know the checkpoint's layout (Meta's consolidated weights: interleaved; Hugging Face's "
        "converted weights: half-split) and compare the module with the reference "
        "implementation of that layout on the real weights, as flash-attention tests its Llama "
        "against Hugging Face's; permute W_q and W_k rows when converting."
    ),
    expected=Verdict.SILENT,
    mask="causal",
    convention="internal",
    sources=("meta-pytorch/gpt-fast#190", "Dao-AILab/flash-attention#288"),
    **MODERN,
)
