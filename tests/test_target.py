"""Building a user's module as published: names from real code, config objects, --init, seeds."""

import types
from pathlib import Path

import pytest
import torch

from harness import cli
from harness.doctor import Config, diagnose
from harness.doctor.target import DoctorConfig, Sizes, _typed_config, build, parse_init
from harness.errors import UsageError
from harness.reference import head_count
from tests import construct_config_modules as ccm
from tests import construct_modules as cm
from tests import kwargs_config_modules as kcm

SIZES = Sizes(d_model=32, heads=4, context=64)


def test_required_names_from_real_code_are_filled_by_meaning():
    module = build(cm.real_names, SIZES)
    assert module.kwargs == dict(
        hidden_size=32, num_attention_heads=4, attention_head_size=8, block_size=64,
        attn_pdrop=0.1, layer_idx=0, rope_theta=1.0, dim=32, heads=4,
    )  # fmt: skip


def test_a_required_dropout_is_not_zero_so_dropout_left_on_shows():
    assert build(cm.real_names, SIZES).kwargs["attn_pdrop"] > 0


def test_init_overrides_and_fills_what_the_table_lacks():
    sizes = Sizes(32, 4, init=parse_init(["num_labels=11", "n_embd=16"]))
    assert build(cm.needs_unknown, sizes).kwargs == dict(n_embd=16, num_labels=11)


def test_a_required_name_nobody_knows_is_named_with_the_flag_to_pass():
    with pytest.raises(UsageError, match=r"no value for num_labels; pass --init num_labels=VALUE"):
        build(cm.needs_unknown, SIZES)


@pytest.mark.parametrize("cls", [cm.CausalSelfAttention, cm.TypedAttention])
def test_a_config_parameter_gets_its_config_class_with_the_doctors_sizes(cls):
    module = build(cls, SIZES)
    assert (module.n_embd, module.n_head, module.block_size) == (32, 4, 64)
    assert module.c_attn.weight.shape == (96, 32)


def test_a_config_without_a_class_answers_what_it_knows_and_names_the_rest_in_one_line():
    with pytest.raises(UsageError) as info:
        build(ccm.ReadsManyNames, SIZES)
    message = str(info.value)
    assert "no value for num_labels, norm_style" in message and "\n" not in message
    module = build(ccm.ReadsManyNames, Sizes(32, 4, init={"num_labels": 5, "norm_style": "pre"}))
    assert (module.proj.in_features, module.heads, module.style) == (32, 4, "pre")


def test_the_config_object_answers_table_names_and_init_values():
    config = DoctorConfig(Sizes(48, 6, init={"anything": [1]}))
    assert (config.n_embd, config.num_attention_heads, config.head_dim) == (48, 6, 8)
    assert config.anything == [1]
    with pytest.raises(AttributeError):
        _ = config.not_a_size
    assert getattr(config, "optional", "default") == "default"


def test_construction_is_seeded_and_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    a, b = build(cm.TypedAttention, SIZES, seed=3), build(cm.TypedAttention, SIZES, seed=3)
    c = build(cm.TypedAttention, SIZES, seed=4)
    assert torch.equal(a.c_attn.weight, b.c_attn.weight)
    assert not torch.equal(a.c_attn.weight, c.c_attn.weight)
    assert torch.equal(state, torch.get_rng_state())


@pytest.mark.parametrize(
    ("items", "words"),
    [(["novalue"], "--init wants name=value"), (["2x=1"], "--init wants name=value")],
)
def test_bad_init_is_a_usage_error(items, words):
    with pytest.raises(UsageError, match=words):
        parse_init(items)


def test_init_values_are_python_literals_else_strings():
    assert parse_init(["a=1", "b=0.5", "c=True", "d=gelu", "e=(1, 2)", "f="]) == dict(
        a=1, b=0.5, c=True, d="gelu", e=(1, 2), f=""
    )


def test_cli_builds_from_a_config_and_init(capsys):
    code = cli.main(["doctor", "tests/construct_config_modules.py:ReadsManyNames", "--init",
                     "num_labels=5", "--init", "norm_style=pre", "--d-model", "32"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code in (0, 1) and out.startswith("attention doctor:"), err
    code = cli.main(["doctor", "tests/construct_config_modules.py:ReadsManyNames"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "no value for num_labels, norm_style" in err


class BertStyle(torch.nn.Module):
    """Heads under BERT's attribute name, in a config object: 4 heads, not 1."""

    def __init__(self, d_model: int = 32, heads: int = 4):
        super().__init__()
        self.config = types.SimpleNamespace(num_attention_heads=heads)
        self.query, self.key, self.value = (torch.nn.Linear(d_model, d_model) for _ in range(3))

    def forward(self, x):
        B, T, C = x.shape
        h = self.config.num_attention_heads
        q, k, v = (
            f(x).view(B, T, h, -1).transpose(1, 2) for f in (self.query, self.key, self.value)
        )
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)  # (B, h, T, d)
        return y.transpose(1, 2).reshape(B, T, C)


def test_the_head_count_is_read_under_real_names_and_from_the_config():
    assert head_count(BertStyle(32, 4)) == 4
    assert head_count(torch.nn.Linear(2, 2)) == 1
    d = diagnose(BertStyle(32, 4), Config())
    sdpa = next(f for f in d.findings if f.probe == "agrees with SDPA")
    assert sdpa.status == "pass" and "4 head(s)" in sdpa.message, sdpa.message


def test_init_names_beyond_a_dataclass_configs_fields_are_set_on_it():
    """transformers' configs take **kwargs; a plain dataclass gets the attribute afterwards."""
    sizes = Sizes(32, 4, init=parse_init(["attn_implementation='sdpa'"]))
    made = build(cm.CausalSelfAttention, sizes)
    config = made.config
    assert config.attn_implementation == "sdpa" and config.n_embd == 32


def test_a_config_class_in_a_file_given_by_path_is_found_with_its_defaults(tmp_path, capsys):
    """Loaded by path, the file is a module of its own: its GPTConfig (and the defaults of
    fields the doctor has no value for, such as num_labels) are used."""
    text = Path(cm.__file__).read_text()
    text = text.replace(
        "    bias: bool = True\n", "    bias: bool = True\n    num_labels: int = 50257\n"
    )
    text = text.replace(
        "self.config = config", "self.config = config\n        assert config.num_labels"
    )
    target = tmp_path / "gpt.py"
    target.write_text(text)
    code = cli.main(["doctor", f"{target}:CausalSelfAttention", "--causal"])
    assert code == 0, capsys.readouterr()


def test_a_partial_rotary_width_is_sized_with_the_head():
    config = DoctorConfig(Sizes(64, 4))
    assert (config.head_dim, config.rotary_dim, config.rotary_ndims) == (16, 8, 8)


def test_latent_attention_sizes_follow_the_head():
    config = DoctorConfig(Sizes(64, 4))
    assert (config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim) == (8, 8, 16)
    assert (config.kv_lora_rank, config.q_lora_rank) == (32, 32)


def test_a_plain_config_class_derives_what_it_does_not_take():
    """A config class without **kwargs is given what its __init__ takes; what it derives
    (litgpt's head_size = n_embd // n_head) is its own, not passed back in."""
    from tests.model_modules import LitConfig

    config = _typed_config(LitConfig, Sizes())
    assert (config.n_embd, config.n_head, config.head_size) == (64, 4, 16)


class _LatentConfig:
    """A latent attention's config, sized at the doctor's width and head count by default,
    with heads 24 wide of its own (16 without positions, 8 with) and K/V heads of its own."""

    def __init__(self, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                 qk_nope_head_dim=16, qk_rope_head_dim=8, query_pre_attn_scalar=24):  # fmt: skip
        self.hidden_size, self.num_attention_heads = hidden_size, num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.qk_nope_head_dim, self.qk_rope_head_dim = qk_nope_head_dim, qk_rope_head_dim
        self.query_pre_attn_scalar = query_pre_attn_scalar


def test_a_config_sized_as_the_doctor_builds_keeps_its_own_attention_sizes():
    """Where a config's defaults already give the doctor's width and head count, its own head
    widths, K/V heads and scale stand (a user reading them declares their scale); where they do
    not, or the user says otherwise (--kv-heads, --scale), the doctor's sizes are put."""
    kept = _typed_config(_LatentConfig, Sizes(64, 4))
    assert (kept.qk_nope_head_dim, kept.qk_rope_head_dim, kept.num_key_value_heads) == (16, 8, 4)
    assert kept.query_pre_attn_scalar == 24
    told = _typed_config(_LatentConfig, Sizes(64, 4, kv_heads=2, scale=32**-0.5))
    assert (told.num_key_value_heads, told.query_pre_attn_scalar) == (2, 32)
    resized = _typed_config(_LatentConfig, Sizes(32, 4))
    assert (resized.hidden_size, resized.qk_nope_head_dim, resized.qk_rope_head_dim) == (32, 4, 4)
    assert resized.query_pre_attn_scalar == 8  # the head width's, with no scale declared


def test_a_config_class_that_takes_its_sizes_as_kwargs_is_given_those_its_layer_reads():
    """minGPT's ``GPTConfig(vocab_size, block_size, **kwargs)``: the sizes its layer reads are
    asked for by the code (an AttributeError on the config the doctor built), then set."""
    module = build(kcm.ReadsItsWidth, Sizes(32, 4, init={"vocab_size": 50, "block_size": 16}))
    assert module.n_head == 4 and module.qkv.in_features == 32, module


def test_a_config_that_keeps_a_size_per_stage_keeps_its_lists():
    """PVT's config holds one head count per stage (a list); its layer is handed its own: the
    config is built with its lists as they are, the layer with the doctor's sizes."""
    module = build(kcm.StagedAttention, Sizes(32, 4))
    assert module.num_attention_heads == 4 and module.qkv.in_features == 32, module
