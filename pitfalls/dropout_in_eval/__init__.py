"""Card for dropout_in_eval: f.dropout left on in eval mode."""

from harness.catalogue.card import Card, Verdict

CARD = Card(
    id="dropout_in_eval",
    title="F.dropout left on in eval mode",
    section="—",
    category="numerics",
    claim="Not named by the tutorial; the common belief: model.eval() turns dropout off.",
    trap=(
        "F.dropout(weights, p) inside forward: the functional form's training argument defaults"
        " to True."
    ),
    truth=(
        "model.eval() only switches nn.Dropout modules; the functional call keeps dropping: two"
        " identical calls in eval mode differ."
    ),
    why="Evaluation and inference are random and biased low; results do not reproduce.",
    avoid="Use an nn.Dropout module, or pass training=self.training.",
    expected=Verdict.SILENT,
)
