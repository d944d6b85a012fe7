"""Card for transpose: K transposed over the wrong axes."""

from harness.catalogue.card import Card, Verdict

CARD = Card(
    id="transpose",
    title="K.transpose(0, 1) instead of K.transpose(1, 2)",
    section="§3.2",
    category="layout",
    claim="A wrong transpose of K breaks Q @ K^T: a bmm error or a garbled result.",
    trap="torch.bmm(Q, K.transpose(0, 1)) swaps batch and time instead of time and features.",
    truth=(
        "It raises on ordinary shapes, but runs whenever batch == seq_len == d_k and then mixes "
        "batch elements: the harness finds that trigger by search, smallest at "
        "batch = seq_len = d_k = 2."
    ),
    why=(
        "Tests with tiny square shapes (2, 2, 2) are exactly the ones on which it runs, so a "
        "passing toy test can hide it."
    ),
    avoid="Use K.transpose(-2, -1) (or K.mT) and test on shapes whose sizes all differ.",
    expected=Verdict.CONDITIONAL,
)
