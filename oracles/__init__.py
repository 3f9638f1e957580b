"""mlafuzz.oracles."""
