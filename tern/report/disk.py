"""The disk a report's notebooks fill, checked before the first notebook runs.

Notebook 06 decodes the sweep's random models and the 105m / 206m pair (tern.measure.sweep);
notebook 08 builds the ~10B-total model its design search picks. In full mode that is ~13 GB,
written 10-20 minutes into the report; a disk that cannot hold it should stop the report
before it starts, not part-way through. The sweep's models are exact (the same points, the
same files: tern.measure.sweep_models). Notebook 08's pick is made on this host's profile,
which the report measures later, so it is planned here as the pick on the shipped reference
profile: another ~10B-total config of the same search, ±10 % in total params.
"""

from __future__ import annotations

from pathlib import Path

from tern.measure.sweep_models import ModelsPlan, check_free_space, plan_models

SWEEP_NOTEBOOK, TEN_B_NOTEBOOK = "06", "08"  # the notebooks that write models (by number)


def report_models_plan(results: str | Path, notebooks: list[str], smoke: bool) -> ModelsPlan:
    """The random models the report's ``notebooks`` (their stems, e.g. "06_measured_vs_predicted")
    would write into ``results``/models that are not there yet."""
    from tern.core.config import get_preset
    from tern.measure.sweep import default_points

    numbers = {n[:2] for n in notebooks}
    configs = []
    if SWEEP_NOTEBOOK in numbers:
        configs += [p.config for p in default_points(quick=smoke, threads=[1])]  # every thread count: same models
        configs += [get_preset(n) for n in ("105m", "206m")]
    if TEN_B_NOTEBOOK in numbers:
        from tern.predict.hosts import load_reference_profile
        from tern.predict.toward_10b import pick_10b, scaled_down

        pick, _, _ = pick_10b(load_reference_profile(), threads=1)
        configs.append(scaled_down(pick.config, 256) if smoke else pick.config)
    return plan_models(configs, Path(results) / "models")


def check_report_disk(results: str | Path, notebooks: list[str], smoke: bool) -> ModelsPlan:
    """:func:`report_models_plan`, refused (OSError ENOSPC with the figures) when it does not fit."""
    plan = report_models_plan(results, notebooks, smoke)
    check_free_space(plan, keep_models=True, what="the report (notebooks 06 and 08)",
                     hint="free some space, write the report on a larger disk (--out), run it with --smoke, "
                          "or leave out the measuring notebooks (--only)")
    return plan
