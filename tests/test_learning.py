"""The learning probe: its tasks, its training, what it names, and the command that runs it."""

import math
import subprocess
import sys
from functools import cache
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

from harness import cli, learning
from harness.catalogue import registry
from harness.catalogue.learn import fixed_key, learn, learn_all, task_for
from harness.cli import catalogue as catalogue_commands
from harness.inputs import generator
from harness.learning import (
    IGNORE,
    Claim,
    Diagnosis,
    Learning,
    Run,
    Task,
    TinyModel,
    diagnose,
    evaluate,
    prefix_generation,
    train,
)

ROOT = Path(__file__).resolve().parents[1]


class Identity(nn.Module):
    """No attention at all: each position's output is its own input."""

    def forward(self, x, mask=None):
        return x, None


class Plain(nn.Module):
    """Correct single-head attention; ``causal`` masks the future, ``leak`` lets each query
    also see the next key (the causal_leak bug, written here apart from the catalogue)."""

    def __init__(self, d_model=32, d_k=16, causal=False, leak=False):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(d_model, d_k, bias=False) for _ in range(3))
        self.causal, self.leak = causal, leak

    def forward(self, x, mask=None):
        scores = self.q(x) @ self.k(x).transpose(1, 2) / self.q.out_features**0.5  # (B, T, T)
        if self.causal:
            T = x.size(1)
            allowed = torch.ones(T, T, dtype=torch.bool).tril(1 if self.leak else 0)
            scores = scores.masked_fill(~allowed, float("-inf"))
        weights = scores.softmax(-1)
        return weights @ self.v(x), weights


def trained(module, task, d_out, steps=learning.STEPS, generate=True):
    def attend(m, x, batch):
        return m(x)

    torch.manual_seed(0)
    model = TinyModel(module, d_out)
    run = train(model, task, attend, seed=0, steps=steps)
    gen = prefix_generation(attend) if generate and task.causal else None
    return evaluate(run, model, task, attend, gen, seed=0)


# --- tasks -------------------------------------------------------------------------------------


def test_recall_answers_are_the_values_stored_under_the_queried_keys():
    batch = Task("recall").draw(8, generator(3))
    for tokens, targets in zip(batch.tokens.tolist(), batch.targets.tolist(), strict=True):
        pairs = tokens[: 2 * learning.PAIRS]
        store = dict(zip(pairs[0::2], pairs[1::2], strict=True))
        asked = [(t, targets[i]) for i, t in enumerate(tokens) if targets[i] != IGNORE]
        assert len(asked) == learning.QUERIES
        assert all(tokens[i - 1] == learning.MARK for i, t in enumerate(targets) if t != IGNORE)
        assert all(store[key] == value for key, value in asked)
    assert batch.keep is None and bool((batch.answers == (batch.targets != IGNORE)).all())


def test_padded_recall_blocks_the_padding_and_asks_only_real_pairs():
    batch = Task("recall", padded=True).draw(32, generator(4))
    real = batch.keep[:, 0]  # (B, T): the keys every query may see
    assert bool(real[0].all()) and not bool(real.all())
    padding = batch.tokens[~real]
    assert bool((padding == learning.MARK).all())
    for tokens, targets, keep in zip(batch.tokens, batch.targets, real, strict=True):
        stored = {  # key -> value of the real pairs only
            int(tokens[i]): int(tokens[i + 1]) for i in range(0, 2 * learning.PAIRS, 2) if keep[i]
        }
        asked = (targets != IGNORE).nonzero().flatten()
        assert len(asked) == learning.QUERIES
        assert all(stored[int(tokens[i])] == int(targets[i]) for i in asked)


@pytest.mark.parametrize("task", [Task("copy"), Task("copy", period=3)], ids=["8", "3"])
def test_copy_answers_are_predictable_and_the_prompt_is_not(task):
    batch = task.draw(16, generator(5))
    P = task.period
    t = torch.arange(task.seq_len)
    assert bool((batch.targets[:, :-1] == batch.tokens[:, 1:]).all())
    assert bool((batch.answers == ((t >= P) & (t < task.seq_len - 1))).all())
    # every answer is the token that followed the current one a period earlier
    assert bool((batch.tokens[:, P:] == batch.tokens[:, :-P]).all())
    prompt = batch.tokens[:, :P]
    assert all(len(set(row.tolist())) == P for row in prompt)  # distinct: one match only


def test_left_padded_copy_keeps_padding_out_of_keys_queries_and_answers():
    batch = Task("copy", period=4, left_pad=True).draw(16, generator(6))
    real = batch.keep.any(dim=1)  # (B, T)
    assert bool(real[0].all()) and not bool(real.all())
    assert bool((batch.keep.sum(-1)[~real] == 0).all())  # a padding query sees nothing
    assert not bool((batch.answers & ~real).any())
    assert bool((batch.targets[~real] == IGNORE).all())


def test_packed_copy_restarts_positions_and_scores_nothing_across_documents():
    task = Task("copy", period=3, packed=True)
    batch = task.draw(16, generator(7))
    starts = (batch.positions == 0).int().argmax(-1)  # first 0 is position 0 itself
    second = (batch.positions[:, 1:] == 0).int().argmax(-1) + 1  # (B,)
    assert bool((starts == 0).all()) and bool((second >= 2 * task.period + 1).all())
    for row, start in enumerate(second.tolist()):
        assert int(batch.targets[row, start - 1]) == IGNORE  # the first document's last token
        assert not bool(batch.answers[row, start : start + task.period].any())  # its prompt
        assert bool(batch.answers[row, start + task.period : -1].all())


def test_a_task_that_does_not_fit_is_refused():
    with pytest.raises(ValueError, match="period"):
        Task("copy", period=9)
    with pytest.raises(ValueError, match="unknown task"):
        Task("sorting")


# --- training ---------------------------------------------------------------------------------


def test_without_attention_recall_cannot_be_learned():
    run = trained(Identity(), Task("recall"), learning.D_MODEL)
    assert run.steps_to_threshold is None
    assert run.eval_accuracy < 0.3  # about chance: 1 in 7 values


def test_plain_attention_learns_recall_and_copy():
    recall = trained(Plain(), Task("recall"), 16)
    copy = trained(Plain(causal=True), Task("copy"), 16)
    assert recall.steps_to_threshold is not None and recall.eval_accuracy > 0.9
    assert copy.steps_to_threshold is not None and copy.generation_accuracy > 0.9
    assert copy.unknowable_accuracy < 0.3  # a causal model cannot know the prompt's next token


def test_a_leak_into_the_future_is_too_good_to_be_true():
    fix = trained(Plain(causal=True), Task("copy"), 16)
    bug = trained(Plain(causal=True, leak=True), Task("copy"), 16)
    d = diagnose(fix, bug)
    assert d.label == learning.TOO_GOOD, d
    assert fix.generation_accuracy == pytest.approx(fix.eval_accuracy, abs=0.02)  # causal: alike
    assert bug.unknowable_accuracy > 0.9 and bug.unknowable_by_generation < 0.3


def test_the_same_seed_gives_the_same_numbers():
    a = learn(registry.load("scale_d_model"), steps=30)
    b = learn(registry.load("scale_d_model"), steps=30)
    pd.testing.assert_frame_equal(a.curves(), b.curves())
    assert a.diagnosis == b.diagnosis and a.bug.eval_accuracy == b.bug.eval_accuracy


def test_a_dropout_left_on_answers_the_same_whatever_ran_before():
    """A module that drops in eval mode is evaluated on the generator seeded for its seed: its
    answers do not depend on how many random numbers the process drew before (the report's
    workers run other pieces of work first)."""
    pair = registry.load("dropout_in_eval")
    torch.manual_seed(1)
    first = learn(pair, steps=5).bug.eval_accuracy
    torch.manual_seed(2)
    torch.rand(1000)
    assert learn(pair, steps=5).bug.eval_accuracy == first


def test_training_leaves_the_global_generator_and_threads_alone():
    threads = torch.get_num_threads()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    learn(registry.load("scale_precision"), steps=3)
    assert torch.equal(torch.rand(3), expected) and torch.get_num_threads() == threads


# --- the catalogue ------------------------------------------------------------------------------

# One pair per kind of task: recall, padded recall, copy (no cache), copy through a KV cache, a
# sliding window's short prompt, packed documents, left-padded rows.
KINDS = [
    "scale_precision",
    "padding_on_queries",
    "mask_bool",
    "cache_causal_alignment",
    "sliding_window_off_by_one",
    "packing_cross_document",
    "left_pad_positions",
]


@cache
def learned(trap: str) -> Learning:
    """The learning probe on a trap of the catalogue at its defaults, made once per module (two
    tests read cache_causal_alignment's)."""
    return learn(registry.load(trap))


@pytest.mark.numbers
@pytest.mark.parametrize("trap", KINDS)
def test_fixed_modules_reach_the_threshold(trap):
    result = learned(trap)
    assert result.fix.steps_to_threshold is not None, result.fix.curve.tail()
    assert result.fix.eval_accuracy >= learning.THRESHOLD
    if result.task.causal:
        assert result.fix.generation_accuracy >= learning.THRESHOLD


def test_the_task_follows_the_card():
    def task(trap):
        pair = registry.load(trap)
        return task_for(pair.card, pair.card.build(pair.fixed, pair.card.shape))

    assert task("scale_precision") == Task("recall")
    assert task("padding_on_queries") == Task("recall", padded=True)
    assert task("mask_bool") == Task("copy")
    assert task("sliding_window_off_by_one").period == 3
    assert task("packing_cross_document").packed
    assert task("left_pad_positions").left_pad


@pytest.mark.numbers
@pytest.mark.parametrize(
    ("trap", "kinds"),
    [
        ("causal_leak", (learning.TOO_GOOD,)),
        ("cache_causal_alignment", (learning.GENERATION,)),
        ("head_split_view", (learning.SLOWER_LABEL, learning.FLAT_LABEL)),
        ("mask_to_additive_nan", (learning.NAN,)),
        ("mask_rank", (learning.RAISES,)),
        ("softmax_upcast_myth", (learning.LEARNS,)),
    ],
)
def test_catalogue_traps_get_their_symptom_over_the_seeds(trap, kinds):
    """A statement over the five seeds (at least four agree), so a seed that another CPU's
    rounding moves across a threshold does not change it."""
    d = learned(trap).diagnosis
    assert d.supports(kinds), d.label


def test_pairs_whose_fixed_py_trains_alike_train_it_once_and_learn_as_alone():
    pairs = [registry.load("causal_leak"), registry.load("mask_rank")]
    cpu = torch.device("cpu")
    assert fixed_key(pairs[0], 0, 5, cpu) == fixed_key(pairs[1], 0, 5, cpu)
    assert fixed_key(pairs[0], 0, 5, cpu) != fixed_key(registry.load("missing_scale"), 0, 5, cpu)
    same_code = [registry.load(pid) for pid in ("fill_too_small", "missing_scale")]
    assert fixed_key(same_code[0], 0, 5, cpu) != fixed_key(same_code[1], 0, 5, cpu)  # masks
    assert fixed_key(pairs[0], 0, 5, cpu) != fixed_key(pairs[0], 1, 5, cpu)
    shared = learn_all(pairs, steps=5)
    assert shared[0].fix is shared[1].fix  # one training
    for both, alone in zip(shared, (learn(p, steps=5) for p in pairs), strict=True):
        assert both.diagnosis.label == alone.diagnosis.label
        pd.testing.assert_frame_equal(both.curves(), alone.curves())


def test_numeric_and_conditional_traps_say_what_the_probe_cannot_show():
    assert "NUMERIC" in learn(registry.load("qk_overflow_half"), steps=5).note
    conditional = learn(registry.load("transpose"), steps=5)
    assert conditional.diagnosis.kind == learning.RAISES
    assert "trigger" in conditional.note


# --- naming the symptom from two runs ---------------------------------------------------------


def run(accuracy, loss=None, **kw):
    """A run whose answer accuracy per step is ``accuracy``."""
    steps = len(accuracy)
    loss = loss or [1.0] * steps
    curve = pd.DataFrame({"step": range(1, steps + 1), "loss": loss, "accuracy": accuracy})
    kw.setdefault("eval_accuracy", accuracy[-1])
    return Run(curve, **kw)


LEARNS_AT_20 = [0.1] * 10 + [1.0] * 50  # mean of 10 = 0.91 at step 19: nine 1.0s and a 0.1


def test_steps_to_threshold_is_the_first_step_whose_mean_of_ten_reaches_it():
    assert run(LEARNS_AT_20).steps_to_threshold == 19
    assert run([0.1] * 10 + [0.95] * 8 + [0.1] * 42).steps_to_threshold is None


@pytest.mark.parametrize(
    ("bug", "label"),
    [
        (run(LEARNS_AT_20), learning.LEARNS),
        (run([0.1] * 11 + [1.0] * 49), learning.LEARNS),  # one step later: not identical
        (run([0.1] * 30 + [1.0] * 30), learning.SLOWER_LABEL),  # 39 steps against 19: x2
        (run([1.0] * 60), learning.FASTER_LABEL),
        (run([0.1] * 10 + [0.95] * 40 + [0.9] * 10), learning.SLOWER_LABEL),  # ends 0.1 lower
        (run([0.1] * 50 + [0.2] * 10), learning.FLAT_LABEL),
        (run([0.1] * 30 + [0.6] * 30), learning.SLOWER_LABEL),  # never: at least x60/19
        (run(LEARNS_AT_20, loss=[1.0] * 30 + [math.nan] * 30), learning.NAN),
        (Run(pd.DataFrame(columns=["step", "loss", "accuracy"]), error="E: x"), learning.RAISES),
        (run(LEARNS_AT_20, eval_error="E: y"), learning.RAISES),
        (run(LEARNS_AT_20, eval_accuracy=0.9), learning.EVALUATION),
    ],
)
def test_diagnose_names_each_symptom(bug, label):
    assert diagnose(run(LEARNS_AT_20), bug).label.startswith(label)


def test_identical_training_says_the_bug_never_fired():
    assert diagnose(run(LEARNS_AT_20), run(LEARNS_AT_20)).identical
    assert not diagnose(run(LEARNS_AT_20), run([0.1] * 11 + [1.0] * 49)).identical
    nearly = run(LEARNS_AT_20, loss=[1.0] * 59 + [1.001])
    assert not diagnose(run(LEARNS_AT_20), nearly).identical


def test_the_ratio_is_of_steps_counted_from_one():
    assert diagnose(run(LEARNS_AT_20), run([0.1] * 30 + [1.0] * 30)).ratio == 39 / 19


def test_a_claim_is_the_tally_of_every_seed_with_the_first_agreeing_seed_shown():
    slower = Diagnosis(f"{learning.SLOWER_LABEL} (never 90%: ×>3.2)", "rise 0.16", 3.2)
    flat = Diagnosis(learning.FLAT_LABEL, "rise 0.1")
    most = Claim((slower, flat, flat, flat, flat), first_seed=10)
    assert most.label == "does not learn 4/5 · learns slower 1/5" and most.kind == "does not learn"
    assert most.shown == 1 and most.evidence == "seed 11: does not learn; rise 0.1"
    split = Claim((slower, flat, slower, flat, flat), first_seed=0)
    assert split.kind == "mixed" and split.label.startswith("mixed: does not learn 3/5")
    assert split.shown == 0 and split.ratio == 3.2  # mixed: the first seed is shown
    assert split.supports((learning.SLOWER_LABEL, learning.FLAT_LABEL))
    assert not split.supports((learning.FLAT_LABEL,))


def test_identical_training_is_claimed_only_when_every_seed_trains_alike():
    same = diagnose(run(LEARNS_AT_20), run(LEARNS_AT_20))
    moved = diagnose(run(LEARNS_AT_20), run([0.1] * 11 + [1.0] * 49))
    assert Claim((same,) * 5, 0).identical and Claim((same,) * 5, 0).kind == learning.LEARNS
    mostly = Claim((same,) * 4 + (moved,), 0)
    assert mostly.kind == learning.LEARNS and not mostly.identical
    assert mostly.label == "learns normally 5/5"  # one outcome: identical or not, it learns


def causal(accuracy=1.0, generated=1.0, unknowable=0.05, unknowable_generated=0.05):
    return run(
        LEARNS_AT_20,
        eval_accuracy=accuracy,
        generation_accuracy=generated,
        unknowable_accuracy=unknowable,
        unknowable_by_generation=unknowable_generated,
    )


def test_reading_the_future_is_too_good_and_a_broken_cache_is_wrong_in_generation():
    assert diagnose(causal(), causal(unknowable=1.0)).label == learning.TOO_GOOD
    assert diagnose(causal(), causal(generated=0.2)).label == learning.GENERATION
    # a gap the fixed module shares is the task's, not the bug's
    assert diagnose(causal(generated=0.5), causal(generated=0.2)).label.startswith(learning.LEARNS)
    # a leak the fixed module has as well is not the bug's
    leaky = causal(unknowable=1.0, unknowable_generated=0.0)
    assert diagnose(leaky, leaky).label.startswith(learning.LEARNS)
    # predicting the unknowable by generation too would not be reading the future
    both = causal(unknowable=1.0, unknowable_generated=1.0)
    assert diagnose(causal(), both).label.startswith(learning.LEARNS)


def test_nothing_is_said_when_the_fixed_module_does_not_learn():
    assert diagnose(run([0.1] * 60), run(LEARNS_AT_20)).label == learning.NO_BASELINE
    # but a bug that raises or turns NaN says so whatever the fixed module does
    nan = run(LEARNS_AT_20, loss=[math.nan] * 60)
    assert diagnose(run([0.1] * 60), nan).label == learning.NAN


def test_the_table_has_generation_columns_only_for_causal_tasks():
    same = run(LEARNS_AT_20)
    recall = learning.Learning(Task("recall"), same, same, Diagnosis("x", ""))
    copy = learning.Learning(Task("copy"), causal(), causal(), Diagnosis("x", ""))
    assert "by generation" not in recall.table() and "by generation" in copy.table()
    assert "raised" not in copy.table()


# --- the command ------------------------------------------------------------------------------


def test_learn_prints_the_table_and_writes_the_curves(capsys, tmp_path):
    code = cli.main(["learn", "causal_leak", "--steps", "40", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "buggy.py: too good to be true" in out and "| fixed.py |" in out
    curves = pd.read_csv(tmp_path / "causal_leak.csv")
    assert list(curves.columns) == [
        "step", "fixed.py loss", "fixed.py accuracy", "buggy.py loss", "buggy.py accuracy"
    ]  # fmt: skip
    assert len(curves) == 40 and (tmp_path / "causal_leak.png").stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["causal_leak.csv", "causal_leak.png"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["learn", "nope"], "unknown pitfall 'nope'"),
        (["learn", "mask_bool", "--steps", "0"], "--steps: must be at least 1"),
        (["learn", "mask_bool", "--steps", "x"], "--steps: not an integer"),
        (["learn", "mask_bool", "--device", "tpu"], "tpu"),
        (["learn", "mask_bool", "--seed", str(2**64)], "--seed: a seed is an integer from 0 to"),
        (["learn", "mask_bool", "--seed", "-1"], "--seed: a seed is an integer from 0 to"),
        (["learn", "mask_bool", "--steps", str(10**20)], "--steps: must be at most 1,000,000"),
    ],
)
def test_learn_bad_input_is_one_line_and_writes_nothing(capsys, tmp_path, argv, message):
    out = tmp_path / "out"
    code = cli.main([*argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1
    assert not out.exists()


@pytest.fixture
def no_training(monkeypatch):
    """learn fails the test if it gets as far as training."""

    def learn(*args, **kwargs):
        raise AssertionError("trained before the destinations were checked")

    monkeypatch.setattr(catalogue_commands, "learn", learn)


@pytest.mark.parametrize("name", ["mask_bool.png", "mask_bool.csv"])
def test_learn_refuses_a_folder_where_its_file_goes_before_training(
    capsys, tmp_path, no_training, name
):
    (tmp_path / name).mkdir()
    code = cli.main(["learn", "mask_bool", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"{name} in it is not a file" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_learn_writes_through_no_link_planted_in_its_folder(capsys, tmp_path):
    """A link where a file goes is replaced, never followed; the run stages its files in a
    folder of its own, so no fixed name in --out is ever opened for writing."""
    out, outside = tmp_path / "out", tmp_path / "outside"
    out.mkdir(), outside.mkdir()
    for name in ("mask_bool.csv", "mask_bool.png", ".mask_bool.png.partial"):
        (outside / name).write_text("not yours")
        (out / name).symlink_to(outside / name)
    assert cli.main(["learn", "mask_bool", "--steps", "3", "--out", str(out)]) == 0
    assert [p.read_text() for p in sorted(outside.iterdir())] == ["not yours"] * 3
    for name in ("mask_bool.csv", "mask_bool.png"):
        assert (out / name).is_file() and not (out / name).is_symlink()
    assert not list(out.glob(".staging-*"))


def test_two_learn_runs_into_one_folder_both_finish(tmp_path):
    command = [sys.executable, "-m", "harness", "learn", "mask_bool", "--steps", "3",
               "--out", str(tmp_path)]  # fmt: skip
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=ROOT) for _ in range(2)]  # fmt: skip
    for run in runs:
        _, err = run.communicate(timeout=240)
        assert run.returncode == 0 and err == "", err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mask_bool.csv", "mask_bool.png"]
    assert len(pd.read_csv(tmp_path / "mask_bool.csv")) == 3


def test_learn_interrupted_while_training_leaves_no_folder_behind(capsys, tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(catalogue_commands, "learn", interrupted)
    out = tmp_path / "new" / "out"
    assert cli.main(["learn", "mask_bool", "--out", str(out)]) == 130
    assert list(tmp_path.iterdir()) == []
