"""What the runs measured, set against the paper (arXiv 2604.06268), in rooms by concern. A room imports from its
own modules, from the rooms before it in this order and from `names` (tests/test_layers.py checks it, the modules
named in strings included):

    names     every MLflow name analysis reads -- metric names, param keys, tags -- in one place (no room: all use it)
    stores    the readers of what a sweep left: the MLflow tracking store (mlflow_store and its client and SQL
              readers), archives, rollout-batch artifacts, the orch state store's cells
    paper     the paper map (`paper.py`, one module): every published number and claim, its kind and margin, the
              sweeps and metrics that measure it
    stats     the statistics over runs and their verdicts, each beside its calibration record: the judge
              (verdicts.py, judge_rates.yaml), summaries, trends, correlations, the decline rule (early_warning),
              the collapse alert's calibration, the planted controls, the Std(RV)/Mean(RV) predictor and its held-out
              record (predictor_record.yaml), the findings of docs/science.md (science.py)
    reports   what `orch report` and the other commands show: the sweep report, the paper's side-by-side, answers,
              tables, figures, the filter and predictor views
    cli       `orch runs`, `orch report`, `orch archive`, ... (the top: it may import every room)
"""
