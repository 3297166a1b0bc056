# The audit's wiring functions (rules/audit.smk includes this file): which transcripts it reads.

AUDIT_TABLE = TABLES / "audit_one_run.parquet"

#: the methods whose runs go through the DP-SGD engine (pipeline/privacy/dpsgd.py)
AUDITED_METHODS = ("dpdm", "straightdp")


def _audited_claims():
    """Transcript -> claims of the chosen audited methods (the stage picks their DP-SGD lines)."""
    return _registered(lambda methods: REGISTRY.transcripts([m for m in AUDITED_METHODS if m in methods]))


def _audited_transcripts():
    return {Path(p).stem: p for p in _audited_claims()}
