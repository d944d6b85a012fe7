"""Wing 1, the catalogue engine: measure a buggy/fixed pair and give it a verdict.

card (Card, Pair) -> registry (discovers ``pitfalls/<id>/``) -> compare (three runs, tables)
-> judge (verdict: ordinary, trigger search, edge inputs, one head, over seeds).
Kept import-light: every trap's card imports ``harness.catalogue.card``.
"""

from pathlib import Path

PACKAGE = "pitfalls"
# Where the catalogue is installed: beside the harness package, in a clone or in site-packages.
HOME = Path(__file__).resolve().parents[2] / PACKAGE
