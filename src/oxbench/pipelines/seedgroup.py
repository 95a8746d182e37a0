"""Seed groups: one method run once per seed, the seed a declared repeat axis (issue 32).

``oxbench run --seeds 0,1,2`` (``oxbench.run(..., seeds=[0, 1, 2])``) runs the method once per
seed. Member ``s`` sets **every seed setting of the method** (:func:`oxbench.schema.seed_settings`:
every setting named ``seed`` in its group: ``vocabulary.seed`` of BoW / ASMK / HE, ``he.seed`` of
HE, ``search.seed`` of an IVF-PQ search, a descriptor kind's ``descriptor.seed`` (a CNN's random
weights) and ``descriptor.vocabulary.seed`` (VLAD's codebook k-means), a plugin's ``<group>.seed``)
to ``s``. It does not change the
generation seed of a synthetic dataset (the test set stays the same images) nor any other setting.

All members go to ONE config folder: its ``config.json`` is the run's config with each seed setting
replaced by :data:`PER_SEED` and a ``repeat`` entry naming the axis and the settings it sets, so
the folder's digest does not depend on the seeds; each run folder keeps its own full config (its
seeds included), and its ``record.json`` says which group it belongs to (``seed_group``: the group
id, the member's seed, the group's seeds, the settings set). Steps a seed does not touch (local
features, descriptors) have cache keys without the seed and so are computed once and shared.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oxbench.errors import InputError
from oxbench.schema import SeedList, seed_settings

#: What a seed group's folder config holds in place of each seed setting.
PER_SEED = "<per seed>"
#: The name of the repeat axis in ``config.json`` and ``record.json``.
AXIS = "seed"


@dataclass(frozen=True)
class SeedMember:
    """One run of a seed group.

    Attributes:
        group: the group's id (the same in every member's record).
        seed: this member's seed.
        seeds: every seed of the group, in the order given.
        settings: the seed settings (dotted names) the seed sets.
    """

    group: str
    seed: int
    seeds: tuple[int, ...]
    settings: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """``record.json``'s ``seed_group``."""
        return {
            "id": self.group,
            "seed": self.seed,
            "seeds": list(self.seeds),
            "settings": list(self.settings),
        }

    def apply(self, m: Any) -> Any:
        """``m`` with every seed setting of the group set to this member's seed."""
        from oxbench.pipelines.presets import resolve_method

        return resolve_method(m, **{name: self.seed for name in self.settings})

    def folder_method(self, method: Mapping[str, Any]) -> dict[str, Any]:
        """A method's settings (``to_dict()``) with each seed setting replaced by :data:`PER_SEED`."""
        out = copy.deepcopy(dict(method))
        for name in self.settings:
            node = out
            *path, last = name.split(".")
            for part in path:
                node = node[part]
            node[last] = PER_SEED
        return out

    def folder_config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The config folder's ``config.json``: ``config`` with the seeds replaced by
        :data:`PER_SEED` and the repeat axis declared; the same for every member and every group
        of the same settings."""
        out = dict(config)
        out["method"] = self.folder_method(config["method"])
        out["repeat"] = {"axis": AXIS, "settings": list(self.settings)}
        return out


def check_seeds(seeds: Sequence[int] | str, *, option: str = "seeds") -> tuple[int, ...]:
    """Seeds as :class:`~oxbench.schema.SeedList` takes them (text ``0,1,2`` or whole numbers).

    Raises:
        InputError: empty, negative, above ``2**32 - 1``, repeated or too many; one line.
    """
    return tuple(SeedList().coerce(option, seeds, what="option"))


def plan_group(m: Any, seeds: Sequence[int], overrides: Mapping[str, object]) -> list[SeedMember]:
    """The members of a seed group of method ``m`` (resolved, overrides applied), one per seed.

    Raises:
        InputError: the method has no seed setting (every member would be the same run), or
            ``overrides`` set one (the group sets them).
    """
    from oxbench.records import new_run_id

    # the seeds the method reads (nested: descriptor.seed, features.seed ...)
    names = tuple(n for n in seed_settings(m) if m.applies(n))
    if not names:
        raise InputError(
            f"{m.name} has no seed setting (nothing in it is learned at random): "
            "--seeds would repeat one run"
        )
    fixed = sorted(k for k in overrides if k in names)
    if fixed:
        raise InputError(
            f"--set {fixed[0]} does not apply with --seeds: each seed of the group sets "
            f"{', '.join(names)}"
        )
    group = new_run_id()
    return [SeedMember(group, s, tuple(seeds), names) for s in seeds]
