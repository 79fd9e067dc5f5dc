#!/usr/bin/env python3
"""Print a GGUF file's tensor table as JSON using the independent `gguf` Python package.

Used by runtime/tests/inspect_models.rs to check our loader against another reader.
"""
import json
import sys

import gguf

r = gguf.GGUFReader(sys.argv[1])
out = {
    "tensors": [
        {"name": t.name, "type": t.tensor_type.name, "shape": [int(d) for d in t.shape], "bytes": int(t.n_bytes)}
        for t in r.tensors
    ],
    "metadata_keys": [f.name for f in r.fields.values() if not f.name.startswith("GGUF.")],
}
json.dump(out, sys.stdout)
