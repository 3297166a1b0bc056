"""Issue #56: the house keeps no list of methods. A house file that the methods plug into reads what each method
declares (:class:`pipeline.plugins.Method`: its data-parallel stages, its input checks, ...) and names none of them,
so a new method edits no house file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.plugins import method_names

ROOT = Path(__file__).resolve().parents[1] / "pipeline"

#: house files that derive every method-specific list from the methods' declarations
DERIVED = ("cli.py", "inputs.py", "plan.py", "launch.py", "distributed.py", "resources.py", "wiring.py", "registry.py",
           "seeds.py", "bundles/sample.py", "bundles/weights.py", "gpu_check.py", "rates.py", "config.py")


def named_methods(path: Path) -> list[str]:
    """The method names ``path`` mentions (code, strings, comments and docstrings alike), also inside a rule's or a
    stage's name (``train_dpdm``): a name bounded by anything but a letter or a digit."""
    names = "|".join(sorted(method_names(), key=len, reverse=True))
    pattern = re.compile(r"(?<![a-z0-9])(" + names + r")(?![a-z0-9])", re.IGNORECASE)
    return sorted({m.group(1).lower() for m in pattern.finditer(path.read_text())})


@pytest.mark.parametrize("name", DERIVED)
def test_a_house_file_names_no_method(name):
    assert named_methods(ROOT / name) == []


def test_the_declared_data_parallel_stages_and_input_checks_are_what_the_house_reads(tmp_path):
    from pipeline import cli, inputs
    from pipeline.config import validate_config
    from pipeline.plugins import data_parallel_stages, methods, resumable_rules

    assert cli.DATA_PARALLEL_STAGES == data_parallel_stages() == ("train_dpdm", "train_straightdp")
    assert set(resumable_rules()) == {"train_dpdm", "train_dpdm_twin", "pretrain_straightdp",
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


def test_every_declared_stream_module_and_bundle_sampler_resolves():
    """A declaration is a string: a typo in it must fail here, not in the first process that draws or samples."""
    from pipeline import seeds
    from pipeline.bundles.sample import samplers
    from pipeline.plugins import methods, resolve

    for name, method in methods().items():
        if method.streams:
            streams = resolve(method.streams)
            assert streams and all(isinstance(s, seeds.Stream) for s in streams), name
            assert all(seeds.stream(s.purpose) is s for s in streams), name
        for sampler, target in method.bundle_samplers:
            assert callable(resolve(target)) and samplers()[sampler] == target, (name, sampler)
    assert set(samplers()) == {"dpdm", "straightdp_flow", "dp_merf"}


def test_the_embedding_familys_streams_are_declared_for_each_of_its_methods():
    from pipeline.baselines.embedding_family import MECHANISM
    from pipeline.methods.baselines.streams import EMBEDDING_FAMILY

    assert set(EMBEDDING_FAMILY) == set(MECHANISM)


def test_a_methods_stream_is_found_in_a_process_that_imported_no_engine_module():
    """``seeds.stream`` reads the declarations itself: a caller imports nothing for a method's stream to exist."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from pipeline import seeds\n"
            "for purpose in ('dpdm.mechanism_noise', 'dpsgd_classifier.draws', 'empden.chunk', 'empden_proxy.start', "
            "'sensgeo.output', 'straightdp.public', 'straightdp.toy_init', 'audit.mia', 'dp_ntk.generator', "
            "'pe.api'):\n"
            "    seeds.stream(purpose)\n"
            "assert seeds.seed_of('dpdm.mechanism_noise', 5) == 7\n"
            "engines = ('training', 'sampling', 'flow', 'baselines', 'audit', 'diagnostics', 'results', 'evaluation')\n"
            "loaded = sorted(m for m in sys.modules if m.split('.')[:2] in [['pipeline', e] for e in engines])\n"
            "assert not loaded, loaded\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_a_chosen_methods_config_checks_run_and_one_left_out_does_not():
    """DPDM's sampling rate is checked where DPDM is chosen (pipeline/methods/dpdm/checks.py), not elsewhere; a
    STRAIGHTDP arm switched off by a later file is dropped whether or not STRAIGHTDP is chosen."""
    from pipeline.config import ConfigError, validate_config

    too_large = {"dpdm": {"batch_size": 10_000}, "data": {"private": {"n_private_train": 500}}}
    with pytest.raises(ConfigError, match=r"^config error at dpdm.batch_size: expected at most "
                                          r"data.private.n_private_train=500 "):
        validate_config({**too_large, "methods": ["dpdm"]})
    validate_config({**too_large, "methods": ["empden"]})
    cfg = validate_config({"methods": ["empden"], "straightdp": {"arms": {"latent": None}}})
    assert "latent" not in cfg["straightdp"]["arms"]


def test_every_declared_target_resolves():
    """A declaration names code that exists: each ``"module:attribute"`` of every method imports and is callable (a
    function) or a collection (streams, workloads)."""
    from pipeline.plugins import methods, resolve

    for name, m in methods().items():
        for target in (m.input_checks, m.config_checks, m.prepare_config, *(t for _, t in m.bundle_samplers),
                       *(t for _, t in m.bundle_exports)):
            if target:
                assert callable(resolve(target)), (name, target)
        for target in (m.streams, m.workloads):
            if target:
                assert len(resolve(target)) > 0, (name, target)


#: the calls of :func:`_toy_export`, the export a test declares for a made-up suffix
_TOY_EXPORTS: list[tuple[Path, Path]] = []


def _toy_export(model_file: Path, out_dir: Path) -> dict:
    _TOY_EXPORTS.append((model_file, out_dir))
    return {"meta": {}}


def test_a_model_file_a_method_exports_itself_is_dispatched_by_its_suffix(tmp_path, monkeypatch):
    """pipeline.bundles.weights names no method: a model file that is not a house denoiser file (``.pt``) goes to the
    export its method declares for that suffix (the baselines' generators: ``.safetensors``)."""
    import pipeline.plugins as plugins
    from pipeline.bundles import weights

    assert plugins.bundle_exports() == {".safetensors": "pipeline.methods.baselines.bundle:export_generator"}
    monkeypatch.setattr(plugins, "bundle_exports", lambda: {".toy": "tests.test_house_names_no_method:_toy_export"})
    _TOY_EXPORTS.clear()
    assert weights.export_weights(tmp_path / "m.toy", tmp_path / "w") == {"meta": {}}
    assert _TOY_EXPORTS == [(tmp_path / "m.toy", tmp_path / "w")]
    monkeypatch.undo()
    clash = {name: plugins.Method(name, bundle_exports=((".x", f"m:{name}"),)) for name in ("a", "b")}
    monkeypatch.setattr(plugins, "methods", lambda: clash)
    with pytest.raises(RuntimeError, match="methods 'a' and 'b' declare different bundle exports"):
        plugins.bundle_exports()
