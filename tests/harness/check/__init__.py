"""Tests of one case's verdict: the comparator, detectors, guards, views, launch errors, the red zone, the ledger."""
