"""mlafuzz.harness."""
