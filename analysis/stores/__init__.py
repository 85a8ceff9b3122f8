"""The readers of what a sweep left: the MLflow tracking store (`mlflow_store`: one loader over `mlflow_client` and
`mlflow_sql`, `mlflow_query` their shared query), archives (`archive`), rollout-batch artifacts (`rollout_artifacts`),
and the orch state store's cells as the CLI hands them in (`sweep_state`)."""
