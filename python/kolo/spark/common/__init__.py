"""What kolo.spark's estimators share: the store (store.py), the backend (backend.py), their data
and parameters (estimator.py) and their Spark ML base classes (base.py)."""
