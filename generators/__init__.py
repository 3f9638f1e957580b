"""mlafuzz.generators: frozen specs, their drawers and materializers, edge-value catalogs.

Shared pieces at this level (spec enums and codec, drawers, cases, call-site
views, shrink steps, error-input classes); device-exact generation in rng/;
each op's own in ops/<op>.py.
Importing a module registers nothing: the op table (harness/ops) lists what
each op uses. Must not import mlafuzz.kernels (the generator never knows
which implementation runs) nor mlafuzz.harness.
"""
