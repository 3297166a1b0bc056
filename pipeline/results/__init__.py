"""Result stages over every method: the table of every evaluated run and the runtime table.

* :mod:`.all_runs` -- ``all_runs.parquet``: one row per evaluated (configuration, seed) of the chosen methods, its
  certified eps recomputed from its ledger transcripts by the replay's accountant, beside its metrics and cost; the
  privacy-utility figure; and the row builders a method's own run table uses (:func:`.all_runs.run_rows`).
* :mod:`.runtime` -- the runtime table and figure, from every job's benchmark file.
* :mod:`.baselines` -- the baselines' run table (its rows are all_runs' rows of the baselines).

Each method's own tables and figures live in its folder (``pipeline/methods/<method>/``). Numbers come from
:mod:`pipeline.privacy` and the methods' samples; these modules only arrange and write them. The ledger replay, an
audit of the claims, is :mod:`pipeline.privacy.replay`.
"""
