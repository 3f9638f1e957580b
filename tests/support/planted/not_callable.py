"""Used by the CLI tests: an --impl target that is not callable."""

gather = 42
