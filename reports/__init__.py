"""mlafuzz.reports."""
