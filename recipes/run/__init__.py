"""A run's record: MLflow bookkeeping and progress reporting, shared by every trainer backend."""
