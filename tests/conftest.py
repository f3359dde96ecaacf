"""Shared test set-up: makes tests/engine_harness.py importable from every test folder."""
