"""Tests of many cases: the fuzz loop, workers and their crashes, quarantine, shrinking, replay, run folders, mutants."""
