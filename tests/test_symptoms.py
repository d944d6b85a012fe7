"""The symptom index: each trap is listed under what its own measurements show, and nowhere else."""

from dataclasses import replace
from functools import cache

import pytest
import torch

from harness.catalogue.judge import measure
from harness.catalogue.learn import learn
from harness.catalogue.registry import load
from harness.report import TrapResult, symptoms
from harness.report.symptom_index import symptom_summary, tally

CPU = torch.device("cpu")
DTYPES = {"float32": torch.float32, "float16": torch.float16}

NAN = "The loss, or some rows of the weights, are NaN"
ODD_MAP = "The same attention for every input, one-hot rows, or rows that do not sum to 1"
SOME_SHAPES = "It works only for some shapes, or only with one head"
FLAT = "The loss is flat or falls slowly"
EXPLODES = "The loss explodes or training is unstable"


@cache
def result(pitfall: str, *dtypes: str) -> TrapResult:
    pair = load(pitfall)
    cells = [measure(pair, CPU, DTYPES[d]) for d in dtypes or ("float32",)]
    extras = [pair.card.extra(pair, CPU, torch.float32)] if pair.card.extra else []
    return TrapResult(pair, cells, [e for e in extras if not e.attrs.get("timing")])


def listed(pitfall: str, *dtypes: str, timed: frozenset[str] = frozenset()) -> dict[str, str]:
    """symptom -> evidence, for one trap."""
    found = symptoms.index([result(pitfall, *dtypes)], set(timed))
    return {name: hits[0][1] for name, _, hits in found if hits}


def test_nan_output_is_a_nan_loss():
    found = listed("softmax_dim")  # the tutorial's causal mask, softmax over the batch
    assert "output[0, 0, 0] = nan" in found[NAN]
    assert NAN not in listed("mask_bool")  # -1e9: a uniform row, not NaN


def test_a_float16_only_nan_is_found_in_its_cell():
    found = listed("qk_overflow_half", "float32", "float16")
    assert found[NAN].startswith("cpu float16: ")


def test_saturating_init_blows_up_gradients_and_makes_the_map_one_hot():
    found = listed("init_unit_variance")
    assert "x fixed.py's" in found[EXPLODES]
    assert "rows saturated" in found[ODD_MAP]
    assert FLAT not in found  # its gradients are larger


def test_missing_scale_is_found_through_its_sweep():
    found = listed("missing_scale")
    assert "(d_k 256)" in found[ODD_MAP]


def test_a_starved_gradient_on_a_trigger_shape_says_nothing_of_training():
    assert FLAT not in listed("v_layout")


def test_a_leak_that_shows_only_at_large_activations_is_found_there():
    found = listed("fill_too_small")
    evidence = found["Great in training, wrong in generation or at inference"]
    assert evidence.startswith("future leak with large activations: buggy.py output at position")
    # at x 300 fixed.py's rows saturate as well: that is the inputs, not a one-hot map
    assert ODD_MAP not in found


def test_rows_that_do_not_sum_to_one_are_a_wrong_map():
    found = listed("scale_after_softmax")
    assert found[ODD_MAP].startswith("rows miss summing to 1")


def test_a_leak_is_great_in_training_and_wrong_in_generation():
    found = listed("causal_leak")
    assert "depends on input 1" in found["Great in training, wrong in generation or at inference"]
    found = listed("dropout_in_eval")
    assert "differ by up to" in found["Great in training, wrong in generation or at inference"]


def test_shape_dependent_traps():
    assert "runs silently on B=" in listed("transpose")[SOME_SHAPES]
    assert listed("head_split_view")[SOME_SHAPES] == ("wrong with several heads, right with one")


def test_a_loud_trap_raises_and_a_float16_error_is_found_in_its_cell():
    assert "batch1 must be a 3D tensor" in listed("mask_rank")["It raises an error"]
    found = listed("fill_overflow_half", "float32", "float16")
    assert found["It raises an error"].startswith("cpu float16: ")


def test_a_timed_trap_is_slow():
    found = listed("head_loop", timed=frozenset({"head_loop"}))
    assert set(found) == {"It is slow"}


@pytest.mark.parametrize("pitfall", ["scale_precision", "qkv_bias", "init_variance"])
def test_a_benign_trap_shows_no_symptom(pitfall):
    assert listed(pitfall) == {}


def test_a_silent_trap_no_rule_catches_is_listed_as_seen_only_by_a_reference(monkeypatch):
    monkeypatch.setattr(symptoms, "SYMPTOMS", ())  # no rule catches anything
    *_, (name, _, hits) = symptoms.index(
        [result("scale_d_model"), result("scale_precision")], set()
    )
    assert name == "Nothing looks wrong, but a reference disagrees"
    assert [trap for trap, _ in hits] == ["scale_d_model"]  # a BENIGN trap is not listed


def test_entropy_above_one_is_called_a_leak_not_uniform():
    evidence = listed("causal_leak")[ODD_MAP]
    assert evidence.endswith(", above 1: weight on keys it must not see)")
    assert listed("mask_bool")[ODD_MAP].endswith("(d_k 8, toward one-hot)")


def with_learning(pitfall: str) -> TrapResult:
    """The trap's one-pass result with its learning probe."""
    return replace(result(pitfall), learning=learn(load(pitfall)))


def trained_listing(pitfall: str) -> dict[str, str]:
    found = symptoms.index([with_learning(pitfall)], set())
    return {name: hits[0][1] for name, _, hits in found if hits}


def test_training_symptoms_come_from_the_learning_probe():
    stalled = trained_listing("head_split_view")[FLAT]
    assert stalled.startswith("training: learns slower"), stalled
    assert "seed 0: learns slower (never 90%: ×>" in stalled
    leak = trained_listing("causal_leak")["Great in training, wrong in generation or at inference"]
    assert leak.startswith("training: too good to be true")
    cache = trained_listing("cache_causal_alignment")
    assert cache["Great in training, wrong in generation or at inference"].startswith(
        "training: wrong in generation"
    )


def test_with_the_learning_probe_a_trap_that_trains_normally_is_not_called_slow():
    """softmax_upcast_myth learns as fixed.py does: no training symptom, whatever one pass says."""
    found = trained_listing("softmax_upcast_myth")
    assert FLAT not in found
    assert "Great in training, wrong in generation or at inference" not in found


def test_nan_outputs_are_not_taken_for_calls_that_differ():
    """padding_on_queries' buggy.py is NaN on its padded rows: two identical calls cannot be
    compared, which is its NaN symptom, not nondeterminism."""
    r = result("padding_on_queries")
    assert "not finite" in r.primary.probes["two identical calls in eval"]
    evidence = symptoms.inference(r) or ""
    assert "two identical calls" not in evidence, evidence


def summary_lines(*pitfalls: str) -> dict[str, str]:
    """The student's index for ``pitfalls``: symptom -> its line."""
    text = symptom_summary([result(p) for p in pitfalls], set())
    lines = [line for line in text.splitlines() if line.startswith("- **")]
    return {line[4:].split("**")[0]: line for line in lines}


def test_the_students_index_names_the_tutorials_traps_first_and_says_where_it_has_none():
    lines = summary_lines("causal_leak", "missing_scale", "mask_bool")
    odd = lines[ODD_MAP]
    assert odd.index("the tutorial's: [`mask_bool`]") < odd.index("near it: [`missing_scale`]")
    assert odd.index("near it:") < odd.index("others: [`causal_leak`]")
    assert lines[NAN].endswith(": none of the tutorial's.")  # and nothing else shows it here
    assert "[`mask_bool`](tutorial.md#mask_bool)" in odd  # linked to where its section is


@pytest.mark.parametrize(
    ("evidence", "said"),
    [
        ("training: learns slower 4/5 · does not learn 1/5: seed 0: learns slower (x)",
         "training: learns slower 4/5"),
        ("training: mixed: learns slower 3/5 · does not learn 2/5: seed 0: ...",
         "training: mixed: learns slower 3/5"),
        ("cpu float32: non-finite: output[0, 0, 0] = nan", None),
    ],
)  # fmt: skip
def test_the_students_index_quotes_only_a_training_tally(evidence: str, said: str | None):
    assert tally(evidence) == said
