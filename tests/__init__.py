"""mlafuzz.tests."""
