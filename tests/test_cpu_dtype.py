"""Which dtype bf16 work runs in on a CPU (clawr1/cpu_dtype.py), decided from the CPU's flags or forced."""
from __future__ import annotations

import torch

from clawr1.cpu_dtype import BF16_FLAGS, cpu_dtype, cpu_flags

ZEN3 = {"avx2", "fma", "f16c"}  # no bf16 instructions
ZEN4 = ZEN3 | {"avx512f", "avx512_bf16", "avx512_vnni"}
SAPPHIRE_RAPIDS = ZEN3 | {"avx512f", "amx_tile", "amx_bf16"}


def test_bf16_runs_in_bf16_only_where_the_cpu_has_bf16_instructions():
    assert cpu_dtype(torch.bfloat16, "auto", ZEN4) == (torch.bfloat16, "")
    assert cpu_dtype(torch.bfloat16, "auto", SAPPHIRE_RAPIDS) == (torch.bfloat16, "")
    dtype, why = cpu_dtype(torch.bfloat16, "auto", ZEN3)
    assert dtype == torch.float32
    assert why.startswith("bf16 falls back to fp32") and all(flag in why for flag in BF16_FLAGS)


def test_the_setting_forces_either_way_and_fp32_is_never_changed():
    dtype, why = cpu_dtype(torch.bfloat16, "off", ZEN4)
    assert dtype == torch.float32 and "run.cpu_bf16=off" in why
    assert cpu_dtype(torch.bfloat16, "on", ZEN3) == (torch.bfloat16, "")
    for setting in ("auto", "on", "off"):
        assert cpu_dtype(torch.float32, setting, ZEN4) == (torch.float32, "")


def test_flags_are_read_from_cpuinfo_and_a_missing_file_means_none(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\n")
    assert cpu_flags(info) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "absent") == set()
