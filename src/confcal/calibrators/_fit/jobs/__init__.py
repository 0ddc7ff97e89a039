"""Streamed full-data fit jobs: per-batch statistics, exact merges and the step between passes
(see :mod:`confcal.passes`)."""
