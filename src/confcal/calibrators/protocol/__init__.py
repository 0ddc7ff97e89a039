"""The contract every method implements: the estimator base class, the method registry, the
manifest (``to_dict`` / ``calibrator_from_dict``), hyper-parameter and fit-record constraints, and batched
prediction over a source."""
