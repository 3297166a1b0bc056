"""The methods, each a plug-in: ``pipeline/methods/<method>`` declares what the house needs to know of it
(:mod:`pipeline.plugins`, the one registry).

A method module (or package) holds ``STAGES``: stage name -> ``"module:attribute"`` of the stage
object (:func:`pipeline.stage.stage`), the command ``python -m pipeline <stage>`` that its rules
in ``rules/<method>.smk`` run, and ``METHOD``, its :class:`Method` declaration (where its tables go
in the report, whether the one-run audit reads its transcripts). Its wiring (runs, paths, params,
targets, transcripts, all_runs records) is its ``wiring`` module. Every list of the house is derived
from the modules found here: the config's ``methods`` values (:func:`pipeline.config.load_schema`),
the report's categories, the audited methods, the CLI's stages; so a new method adds its own files
and edits no list. The ``__init__`` modules hold strings only: stages are imported when run, and
``python -m pipeline --help`` stays fast.
"""
