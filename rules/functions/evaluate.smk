# The evaluation core's wiring functions (rules/evaluate.smk includes this file): the CLIP file each
# evaluation reads and the evaluation params it depends on.

EVALNET = EXPDIR / "evalnet"
CLIP_DIR = EXPDIR / "clip"
CLIP_MODEL = CLIP_DIR / "clip.pt"


def clip_inputs(wildcards=None):
    """The CLIP file an evaluation reads, when evaluation.clip.enabled (unpacked into each evaluate rule)."""
    return {"clip": CLIP_MODEL} if config["evaluation"]["clip"]["enabled"] else {}


def clip_arg(wildcards, input):
    """' clip=<path>' for the evaluate_samples call, or nothing when CLIP metrics are off."""
    return f" clip={shlex.quote(str(input.clip))}" if "clip" in input.keys() else ""


def evaluation_params():
    """The evaluation section an evaluate job depends on (the CLIP training keys reach it through the CLIP file)."""
    ev = dict(config["evaluation"])
    ev["clip"] = {"enabled": ev["clip"]["enabled"]}
    return ev
