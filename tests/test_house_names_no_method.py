"""Issue #56: the house keeps no list of methods. A house file that the methods plug into reads what each method
declares (:class:`pipeline.plugins.Method`: its data-parallel stages, its input checks, ...) and names none of them,
so a new method edits no house file. The files still naming methods are listed as such (strict xfail: the test fails
as soon as one stops naming them, so the list cannot go stale)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.config import method_names

ROOT = Path(__file__).resolve().parents[1] / "pipeline"

#: house files that derive every method-specific list from the methods' declarations
DERIVED = ("cli.py", "inputs.py", "plan.py", "launch.py", "distributed.py", "resources.py", "wiring.py", "registry.py",
           "gpu_check.py", "rates.py")
#: house files that still name methods (issue #56's remaining work)
STILL_NAMING = ("seeds.py", "config.py", "bundles/sample.py")


def named_methods(path: Path) -> list[str]:
    """The method names ``path`` mentions (code, strings, comments and docstrings alike), also inside a rule's or a
    stage's name (``train_dpdm``): a name bounded by anything but a letter or a digit."""
    names = "|".join(sorted(method_names(), key=len, reverse=True))
    pattern = re.compile(r"(?<![a-z0-9])(" + names + r")(?![a-z0-9])", re.IGNORECASE)
    return sorted({m.group(1).lower() for m in pattern.finditer(path.read_text())})


@pytest.mark.parametrize("name", DERIVED)
def test_a_house_file_names_no_method(name):
    assert named_methods(ROOT / name) == []


@pytest.mark.parametrize("name", STILL_NAMING)
@pytest.mark.xfail(strict=True, reason="issue #56: still names methods")
def test_a_house_file_still_to_be_derived_names_no_method(name):
    assert named_methods(ROOT / name) == []


def test_the_declared_data_parallel_stages_and_input_checks_are_what_the_house_reads(tmp_path):
    from pipeline import cli, inputs
    from pipeline.config import validate_config
    from pipeline.plugins import data_parallel_stages, methods, resumable_rules

    assert cli.DATA_PARALLEL_STAGES == data_parallel_stages() == ("train_dpdm", "train_straightdp")
    assert set(resumable_rules()) == {"pretrain_public", "train_dpdm", "train_dpdm_twin", "pretrain_straightdp",
                                      "pretrain_straightdp_arm", "train_straightdp", "privimage_pretrain",
                                      "dp_ldm_pretrain"}
    assert set(cli.DATA_PARALLEL_STAGES) <= set(cli.STAGES)
    # a method's own input checks run only when it is chosen
    cfg = validate_config({"methods": ["empden"], "straightdp": {"public": {"source": "image_folder", "path": None}}})
    keys = [key for key, _ in inputs.input_checks(cfg)]
    assert "straightdp.public.path" not in keys
    chosen = validate_config({"methods": ["straightdp"],
                              "straightdp": {"public": {"source": "image_folder", "path": None}}})
    checks = dict(inputs.input_checks(chosen))
    assert "straightdp.public.path" in checks and methods()["straightdp"].input_checks
    with pytest.raises(Exception, match=r"^config error at straightdp.public.path: expected a folder of class "
                                        r"sub-folders for source image_folder, got null$"):
        inputs.check_inputs_exist(chosen)
