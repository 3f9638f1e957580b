"""mlafuzz.generators: frozen specs, materialize(spec, seed, device), spec strategies, edge catalogs.

Must not import mlafuzz.kernels (the generator never knows which implementation runs).
"""

from mlafuzz.generators.spec import (  # noqa: F401
    SCHEMA_VERSION, ConvertRequest, ConvertSpec, GatherRequest, GatherSpec, Layout, Paging, SpecError,
    TopkMode, ValueMode, WsForm, spec_from_dict, spec_from_json, spec_to_dict, spec_to_json,
)

# Ops defined in their own modules register their spec, materializer and drawer on import.
import mlafuzz.generators.writer  # noqa: E402,F401
import mlafuzz.generators.step  # noqa: E402,F401
