"""Quality (SPEC §16): regression sets, evaluations that compare base / current / candidate.

- :mod:`registry.quality.cases`    parse and validate a regression set (every problem listed)
- :mod:`registry.quality.checks`   run a case's checks on one output (json_schema, regex with a
  match timeout, contains / not_contains, max_chars, refusal)
- :mod:`registry.quality.check_pool` run checks in worker processes (``check_worker``), a
  deadline per answer: what the evaluation runner and the canary analyser call
- :mod:`registry.quality.results`  per-arm figures, pairwise comparison, the verdict
- :mod:`registry.quality.models`   the tables (``regression_sets``, ``quality_policies``,
  ``evaluations``)
- :mod:`registry.quality.store`    services over them (one transaction is the caller's)
- :mod:`registry.quality.runner`   the evaluation runner: every case through the gateway for
  each arm, bounded concurrency, progress in the record, the verdict sets the quality gate
- :mod:`registry.quality.worker`   the background worker of the admin API process (its own
  thread and event loop) and the stale-run sweeper
- :mod:`registry.quality.standalone` ``loraplane serve --role evaluator``: a worker that claims
  the runs an admin API with ``LORAPLANE_EVAL_IN_PROCESS=false`` records
- :mod:`registry.quality.settings` ``EvaluatorSettings`` (``LORAPLANE_EVAL_*``)
"""
