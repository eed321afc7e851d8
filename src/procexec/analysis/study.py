"""The study's models as every analysis output shows them: Table 1's groups and order."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from procexec.config.model import Config

# The paper's Table 1 grouping, in its order; any other group ("demo", ...) follows as "others".
GROUP_ORDER = ("small", "mid", "large", "very-large", "frontier")


GROUP_TITLES = {
    "small": "Small models (<4B)",
    "mid": "Mid-scale models (4B-8B)",
    "large": "Large models (14B-18B)",
    "very-large": "Very large models (20B-30B)",
    "frontier": "Frontier-scale models (>100B)",
    "others": "Other models",
}


def group_rank(group: str) -> int:
    return GROUP_ORDER.index(group) if group in GROUP_ORDER else len(GROUP_ORDER)


def models_frame(config: Config, present: Iterable[str] = ()) -> pd.DataFrame:
    """Models to report, in Table 1 order: the run models plus any model that has data.

    A key found in the data but absent from the config keeps its key as abbreviation,
    so a stray score file is shown rather than silently dropped.
    """
    keys = list(config.run_models) + [k for k in present if k not in config.run_models]
    rows = []
    for order, key in enumerate(dict.fromkeys(keys)):
        model = config.models.get(key)
        if model is None:
            rows.append(
                {"model": key, "abbrev": key, "name": key, "params": "", "group": "others", "gpus": 0, "order": order}
            )
        else:
            rows.append(
                {
                    "model": key,
                    "abbrev": model.abbrev,
                    "name": model.name,
                    "params": model.params or "",
                    "group": model.group if model.group in GROUP_ORDER else "others",
                    "gpus": model.gpus,
                    "order": order,
                }
            )
    frame = pd.DataFrame(rows, columns=["model", "abbrev", "name", "params", "group", "gpus", "order"])
    frame["rank"] = frame["group"].map(group_rank)
    return frame.sort_values(["rank", "order"]).drop(columns=["rank", "order"]).reset_index(drop=True)
