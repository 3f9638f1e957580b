"""mlafuzz.generators."""
