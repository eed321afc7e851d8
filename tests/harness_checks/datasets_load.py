"""Run in .venv-harness: every config of an exported suite folder loaded with datasets 5.2 (offline).

argv: SPEC_JSON with the folder.  Prints the config names, the default config's features (and whether every config has
them), the rows of every config and the row count of the default config ``all``.
"""

import json
import sys

import datasets

folder = json.loads(open(sys.argv[1]).read())["folder"]
configs = datasets.get_dataset_config_names(folder)
loaded = {name: datasets.load_dataset(folder, name, split="test") for name in configs if name != "all"}
every = datasets.load_dataset(folder, split="test")
print(json.dumps({"configs": configs, "features": {k: repr(v) for k, v in every.features.items()},
                  "config_features_equal": all(d.features == every.features for d in loaded.values()),
                  "all_rows": len(every), "rows": {name: d.to_list() for name, d in loaded.items()}}))
