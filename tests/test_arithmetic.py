"""The machine's float32 identity: the CPU and every setting that moves one of its two kernel
families, so that a number made under one is never served or compared as another's."""

import pytest

from harness import arithmetic
from harness.report import receipt, store


@pytest.mark.parametrize(
    ("knob", "value"),
    [("ATEN_CPU_CAPABILITY", "default"), ("MKL_CBWR", "COMPATIBLE"),
     ("MKL_ENABLE_INSTRUCTIONS", "AVX2")],
)  # fmt: skip
def test_each_setting_gives_another_identity(monkeypatch, knob, value):
    for name in arithmetic.KNOBS:
        monkeypatch.delenv(name, raising=False)
    plain = arithmetic.identity()
    monkeypatch.setenv(knob, value)
    assert arithmetic.identity() != plain
    assert arithmetic.settings() == f"{knob}={value}"
    assert f"set: {knob}={value}" in arithmetic.describe("AVX2")


def test_the_cpu_vendor_and_model_are_in_the_identity(monkeypatch):
    plain = arithmetic.identity()
    # a CPU no machine reports, so the identity moves on whichever machine runs this (on an AMD
    # EPYC, "AMD EPYC" left it where it was)
    info = dict(arithmetic.cpuinfo(), vendor_id="NoVendor", **{"model name": "No CPU 1"})
    monkeypatch.setattr(arithmetic, "cpuinfo", lambda: info)
    assert arithmetic.vendor() == "NoVendor" and arithmetic.cpu_name() == "No CPU 1"
    assert arithmetic.identity() != plain
    assert arithmetic.describe("AVX2").startswith("No CPU 1 (NoVendor), ATen AVX2 kernels")


def test_the_store_and_the_receipt_are_keyed_by_the_identity(monkeypatch, tmp_path):
    monkeypatch.delenv("MKL_CBWR", raising=False)
    store.environment.cache_clear()
    before = store.key("x"), receipt.run_key(None, None, True, tmp_path, ["cpu"])
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    store.environment.cache_clear()
    try:
        after = store.key("x"), receipt.run_key(None, None, True, tmp_path, ["cpu"])
    finally:
        monkeypatch.delenv("MKL_CBWR")
        store.environment.cache_clear()
    assert before[0] != after[0] and before[1] != after[1]
