"""Helpers of the subcommands: argument types and caps, error messages, output guards, provenance, the
Dask engine's start-up, and the audit / multilabel renderings shared by several commands."""
