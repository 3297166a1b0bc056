"""The diagnostics' tiny inputs (tests/diagnostics/conftest.py): a private split, a public denoiser file, an
evaluation net and a public split, all 8x8 grey, on one thread."""

from tests.diagnostics.conftest import _one_thread, files  # noqa: F401 (fixtures)
