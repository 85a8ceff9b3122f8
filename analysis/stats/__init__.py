"""The statistics over runs and their verdicts, each beside its calibration record: the judge (`verdicts`, its error
rates in `judge_rates.yaml`), per-cell summaries (`summary`), trends, correlations, the decline rule
(`early_warning`), the collapse alert's calibration (`collapse_alert_calibration`; its rates live beside the rule, in
recipes/stats/collapse_alert_rates.yaml), the planted controls (`controls`), the Std(RV)/Mean(RV) predictor (`predictor`)
and its held-out record (`predictor_record`, `predictor_record.yaml`), and the findings of docs/science.md
(`science`)."""
