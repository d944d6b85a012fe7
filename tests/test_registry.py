"""Discovery of the catalogue and the pair contract's files."""

from pathlib import Path

import pytest

from harness.catalogue import registry
from harness.catalogue.card import Card, Verdict

ROOT = Path(__file__).resolve().parents[1] / "pitfalls"
SECTION_A = {
    "scale_precision", "mask_bool", "transpose", "v_layout", "init_variance",
    "mask_rank", "softmax_dim", "qkv_bias", "head_loop",
}  # fmt: skip


def test_registry_discovers_every_folder():
    folders = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert set(registry.ids()) == folders
    assert folders >= SECTION_A


@pytest.mark.parametrize("pitfall_id", registry.ids())
def test_folder_holds_the_contract_files(pitfall_id):
    folder = ROOT / pitfall_id
    for name in ("__init__.py", "buggy.py", "fixed.py", f"test_{pitfall_id}.py"):
        assert (folder / name).is_file(), name
    pair = registry.load(pitfall_id)
    assert pair.card.id == pitfall_id
    assert pair.card.claim and pair.card.truth and pair.card.avoid and pair.card.section


def test_unknown_id_lists_the_known_ones():
    with pytest.raises(registry.UnknownPitfall) as info:
        registry.load("mask_boool")
    message = str(info.value)
    assert "'mask_boool'" in message
    assert all(i in message for i in registry.ids())


def test_card_rejects_an_unknown_category():
    with pytest.raises(ValueError, match="category"):
        Card(
            id="x", title="", section="", category="vibes", claim="", trap="", truth="",
            why="", avoid="", expected=Verdict.BENIGN,
        )  # fmt: skip


@pytest.mark.parametrize("pitfall_id", registry.ids())
def test_a_card_names_a_tutorial_section_only_when_the_tutorial_names_the_trap(pitfall_id):
    card = registry.load(pitfall_id).card
    named = not card.claim.startswith("Not named by the tutorial")
    assert (card.section != "—") == named, (card.section, card.claim[:40])
