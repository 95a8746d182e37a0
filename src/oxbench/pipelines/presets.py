"""The preset registry and settings: every named method, and a preset with settings changed.

- :data:`METHODS`: every preset of every family by name (the modules of
  :mod:`oxbench.pipelines.families` register theirs with :func:`register_method` on first lookup;
  plugins through the ``oxbench.families`` entry-point group);
- :func:`resolve_method`: a preset with ``--set`` style overrides applied, each value parsed and
  checked by its setting's spec (:mod:`oxbench.schema`);
- :func:`settings_rows`: every setting of a config, as ``oxbench methods NAME`` lists them.

This module stands above the stages (:mod:`oxbench.pipelines.rerankers`), whose settings it parses,
and below the families, which register their presets here.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oxbench.errors import InputError, close_matches
from oxbench.pipelines.method import STAGE_SETTINGS_FIELD, MethodConfig
from oxbench.registry import GROUPS, Registry
from oxbench.schema import SPEC_KEY

# --- the preset registry -------------------------------------------------------------------------

#: The package whose every module is a family (config, method, presets); imported on first lookup.
FAMILIES_PACKAGE = "oxbench.pipelines.families"

#: The preset ``oxbench run`` uses when none is named.
DEFAULT_METHOD = "rootsift-bow-sv-qe"


def _load_families() -> None:
    package = importlib.import_module(FAMILIES_PACKAGE)
    for info in pkgutil.iter_modules(package.__path__, FAMILIES_PACKAGE + "."):
        if not info.name.rsplit(".", 1)[-1].startswith("_"):
            importlib.import_module(info.name)


def _adopt_presets(name: str, obj: object) -> None:
    """An ``oxbench.families`` entry point that names a preset, or a list of presets."""
    for config in obj if isinstance(obj, list | tuple) else [obj]:
        if not isinstance(config, MethodConfig):
            raise TypeError(
                f"entry point {name!r} names {config!r}, not a module or a MethodConfig"
            )
        register_method(config)


#: Every named method of every family, by name; plugins add theirs through the entry-point group
#: ``oxbench.families`` (:mod:`oxbench.registry`).
METHODS: Registry[MethodConfig] = Registry(
    "method", loader=_load_families, group=GROUPS["families"], adopt=_adopt_presets
)


#: ``register_method(config, about=...)``: what each preset is, in one line with its paper.
_PRESET_ABOUT: dict[str, str] = {}


def register_method(config: MethodConfig, *, about: str | None = None) -> MethodConfig:
    """Register a preset under ``config.name`` (a family module calls it for each of its presets).

    ``about`` is the line ``oxbench methods`` shows for it: what it is and its paper
    (``"RootSIFT BoW + spatial verification + AQE from verified images (Chum et al. 2007)"``),
    written beside the preset, as every built-in family does.

    Raises:
        InputError: the name is taken (by this or another family; the line names both modules).
    """
    registered = METHODS.register(config.name, config)
    if about is not None:
        _PRESET_ABOUT[config.name] = " ".join(str(about).split())
    return registered


def preset_about(name: str) -> str:
    """The one line ``oxbench methods`` shows for preset ``name``: what its family registered it
    with (``about=``), else its family's description."""
    METHODS.get(name)  # an unknown name is one line, and the families are loaded
    if name in _PRESET_ABOUT:
        return _PRESET_ABOUT[name]
    family = METHODS.get(name).family
    return next((f.about for f in method_families() if f.name == family), "")


@dataclass(frozen=True)
class MethodFamily:
    """A family of presets, as ``oxbench methods`` lists it: its name, its one-line description
    (the first line of its module's docstring) and its presets in registration order."""

    name: str
    about: str
    presets: tuple[str, ...]


def method_families() -> list[MethodFamily]:
    """Every family with its presets, in the order the families registered their first preset."""
    import sys

    grouped: dict[str, list[str]] = {}
    about: dict[str, str] = {}
    for name in METHODS.names():
        config = METHODS.get(name)
        grouped.setdefault(config.family, []).append(name)
        doc = sys.modules[type(config).__module__].__doc__ or ""
        about.setdefault(config.family, doc.strip().split("\n", 1)[0] if doc.strip() else "")
    return [MethodFamily(f, about[f], tuple(names)) for f, names in grouped.items()]


def list_methods(family: str | None = None) -> list[str]:
    """Names of the registered presets (of one ``family`` when given: ``"bow"``, ``"global"``)."""
    return [n for n in METHODS.names() if family is None or METHODS.get(n).family == family]


def resolve_method(method: str | MethodConfig, **overrides: object) -> MethodConfig:
    """A preset (by name, or a config) with ``overrides`` applied; ``None`` values are ignored.

    Keys are field names; ``a.b`` sets field ``b`` of the nested config in field ``a``
    (``features.max_side=1024``) or setting ``b`` of the stage instance ``a`` of the pipeline
    (``aqe.k=10``, ``spatial.top_r=200``, ``aqe#2.k=3`` for a second ``aqe``; the instance must be
    one of the pipeline's, after ``rerank`` is applied). A value is checked by the setting's
    declared spec (:mod:`oxbench.schema`): text (``--set alpha-qe.alpha=3``) is parsed by it, a typed value checked,
    so a word for a number, NaN, inf or an out-of-range value is one line naming the setting. A
    field without a spec takes text as JSON when it parses (numbers, lists, ``true``), else as text.

    Raises:
        InputError: unknown preset or setting, or a value the setting or the config refuses.
    """
    config = METHODS.get(method) if isinstance(method, str) else method
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    staged: dict[str, dict[str, Any]] = {}
    assert dataclasses.is_dataclass(config)
    fields = {f.name: f for f in dataclasses.fields(config)}
    # whole settings first, so that sub-settings apply to a nested config replaced in the same
    # call (features=h5:a.h5 features.train=b.h5)
    for key, value in sorted(overrides.items(), key=lambda kv: "." in kv[0]):
        if value is None:
            continue
        head, _, sub = key.partition(".")
        if (head not in fields or head == STAGE_SETTINGS_FIELD) and sub and _is_stage_key(head):
            if STAGE_SETTINGS_FIELD not in fields:
                raise InputError(f"method {config.name} has no stages: {key!r} sets nothing")
            staged.setdefault(head, {})[sub] = value
            continue
        if head not in fields or head in ("name", STAGE_SETTINGS_FIELD):
            raise _unknown_setting(config, key)
        current = top.get(head, getattr(config, head))
        if sub:
            if not dataclasses.is_dataclass(current):
                raise InputError(f"unknown method setting {key!r}: {head} has no sub-settings")
            nested.setdefault(head, {})[sub] = value
        elif dataclasses.is_dataclass(current) and SPEC_KEY not in fields[head].metadata:
            raise InputError(f"method setting {key!r} takes sub-settings ({key}.<name>=...)")
        else:
            top[key] = _typed(fields[head], key, value)
    for head, subs in nested.items():
        top[head] = _replace_nested(
            config, top.get(head, getattr(config, head)), subs, head, fields[head]
        )
    if staged:
        top[STAGE_SETTINGS_FIELD] = _stage_settings(config, staged, top.get("rerank"))
    if not top:
        return config
    out = _replace(config, top, f"method {config.name}")
    for key, value in overrides.items():  # a setting that would do nothing is a mistake
        why = out.inapplicable(key) if value is not None else None
        if why is not None:
            raise InputError(why)
    return out


def _replace_nested(
    config: MethodConfig,
    current: Any,
    subs: Mapping[str, object],
    prefix: str,
    owner: dataclasses.Field[Any],
) -> Any:
    """The nested config ``current`` (the value of setting ``prefix``, declared by field
    ``owner``) with the dotted ``subs`` applied (``{"pooling": "rmac"}``, ``{"features.max_side":
    512}``: deeper configs recursively), each value typed by its sub-setting's spec.

    Raises:
        InputError: a sub-setting ``current`` does not have (the line the owner's spec words, if
            it has one: a descriptor kind names the kinds that have it), or a refused value.
    """
    sub_fields = {f.name: f for f in dataclasses.fields(current)}
    changes: dict[str, Any] = {}
    deeper: dict[str, dict[str, object]] = {}
    for sub, value in sorted(subs.items(), key=lambda kv: "." in kv[0]):
        first, _, rest = sub.partition(".")
        key = f"{prefix}.{sub}"
        if first not in sub_fields:
            words = getattr(owner.metadata.get(SPEC_KEY), "unknown_setting", None)
            if words is not None:
                raise InputError(words(current, key, config.name))
            raise _unknown_setting(config, key)
        if rest:
            deeper.setdefault(first, {})[rest] = value
        else:
            changes[first] = _typed(sub_fields[first], key, value)
    for first, more in deeper.items():
        inner = changes.get(first, getattr(current, first))
        if not dataclasses.is_dataclass(inner):
            key = f"{prefix}.{first}.{next(iter(more))}"
            raise InputError(
                f"unknown method setting {key!r}: {prefix}.{first} has no sub-settings"
            )
        changes[first] = _replace_nested(
            config, inner, more, f"{prefix}.{first}", sub_fields[first]
        )
    return _replace(current, changes, f"method {config.name}: {prefix}")


#: Settings groups of earlier versions, each shared by several stages; a stage's settings are now
#: named by the stage instance (``qe.k`` -> ``aqe.k`` or ``alpha-qe.k``).
RETIRED_GROUPS = frozenset({"qe", "vqe", "dqe"})


def _is_stage_key(head: str) -> bool:
    """Whether ``head`` of a dotted setting names a stage instance (``aqe``, ``aqe#2``) or a
    retired settings group."""
    from oxbench.pipelines.rerankers import RERANKERS, stage_of

    return head in RETIRED_GROUPS or stage_of(head) in RERANKERS


def _stage_settings(config: Any, staged: dict[str, dict[str, Any]], rerank: Any) -> Any:
    """``config``'s stage settings with the ``staged`` changes (``{instance: {setting: value}}``);
    each instance must be one of the pipeline's (``rerank``: the new stages, if changed)."""
    from oxbench.pipelines.rerankers import RERANKERS, stage_instances

    stages = tuple(rerank) if rerank is not None else tuple(config.rerank)
    instances = dict(stage_instances(stages))
    out = config.stage_settings
    for instance, subs in staged.items():
        key = f"{instance}.{next(iter(subs))}"
        if instance not in instances:
            raise InputError(_no_such_stage(config, key, instances))
        cls = RERANKERS.get(instances[instance]).settings_type
        if cls is None:
            raise InputError(f"method {config.name}: stage {instance} has no settings ({key})")
        sub_fields = {f.name: f for f in dataclasses.fields(cls)}
        typed = {}
        for sub, value in subs.items():
            if sub not in sub_fields:
                near = close_matches(sub, sub_fields)
                hint = f"; did you mean {instance}.{' or '.join(near)}?" if near else ""
                known = ", ".join(f"{instance}.{n}" for n in sub_fields)
                raise InputError(f"unknown stage setting '{instance}.{sub}'{hint} ({known})")
            typed[sub] = _typed(sub_fields[sub], f"{instance}.{sub}", value)
        current = out[instance] if instance in out else cls()
        out = out.replace(instance, _replace(current, typed, f"method {config.name}: {instance}"))
    return out


def _no_such_stage(config: Any, key: str, instances: Mapping[str, str]) -> str:
    """Why ``key`` names no stage instance of the pipeline ``instances`` (one line), with the
    instances whose settings have that name."""
    from oxbench.pipelines.rerankers import RERANKERS

    sub = key.split(".", 1)[1]
    have = ", ".join(instances) or "none"
    owners = [
        f"{instance}.{sub}"
        for instance, name in instances.items()
        if (cls := RERANKERS.get(name).settings_type) is not None
        and sub in {f.name for f in dataclasses.fields(cls)}
    ]
    where = f"method {config.name}: {key} names no stage of its pipeline (its stages: {have})"
    if owners:
        return f"{where}; a stage's settings are named by the stage: {' or '.join(owners)}"
    return f"{where}; add the stage with --set rerank=..."


def settings_rows(config: MethodConfig) -> list[Any]:
    """Every setting of ``config`` as :class:`oxbench.schema.SettingInfo` rows: its fields (nested
    as dotted names), then the settings of each stage instance of its pipeline (``aqe.k``); those
    that do not apply with the others as they are (:meth:`MethodConfig.applies`) too."""
    from oxbench.schema import describe

    rows = describe(config)
    for instance in getattr(config, "stage_instances", []):
        settings = config.stage(instance)  # type: ignore[attr-defined]
        if settings is not None:
            rows += describe(settings, prefix=f"{instance}.")
    return rows


def other_kind_rows(config: MethodConfig) -> list[Any]:
    """The settings that a local-features setting of ``config`` has with another kind chosen
    (``features.train`` once ``features=h5:PATH``), each once, its doc saying which choice gives it;
    ``oxbench methods NAME --all`` lists them, so that a setting is never invisible because the
    preset extracts its own features."""
    import dataclasses as dc

    from oxbench.features.extractors import LOCAL_EXTRACTORS, LOCAL_FEATURES_SPEC
    from oxbench.schema import SettingInfo, describe

    present = {r.name for r in settings_rows(config)}
    found: dict[str, SettingInfo] = {}
    choices: dict[str, list[str]] = {}
    for row in describe(config):
        if row.kind != LOCAL_FEATURES_SPEC.kind:
            continue
        for name in LOCAL_EXTRACTORS.names():
            entry = LOCAL_EXTRACTORS.get(name)
            choice = (
                f"{row.name}={name}:{entry.argument}" if entry.argument else f"{row.name}={name}"
            )
            if str(row.default).split(":", 1)[0] == name:
                continue  # the preset's own choice: its settings are listed already
            try:
                sample = entry.from_text(entry.argument or "")
            except InputError:
                continue
            for sub in describe(type(sample), prefix=f"{row.name}."):
                if sub.name in present or sub.default is dc.MISSING:
                    continue  # listed already, or the choice's argument itself (PATH)
                found.setdefault(sub.name, sub)
                choices.setdefault(sub.name, []).append(choice)
    return [
        dc.replace(r, doc=f"{r.doc} (with {' or '.join(choices[r.name])})") for r in found.values()
    ]


def _unknown_setting(config: MethodConfig, key: str) -> InputError:
    """One line: the setting ``key`` is not one of ``config``'s; the close matches, else every setting."""
    known = [r.name for r in settings_rows(config)]
    near = close_matches(key, known)
    renamed = getattr(type(config), "renamed", {}).get(key)
    if renamed is not None:  # a name of an earlier version: where the setting lives now
        return InputError(f"method setting {key!r} of {config.name} is now {renamed}")
    where = f"unknown method setting {key!r} for {config.name} ({config.family})"
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        hint = getattr(f.metadata.get(SPEC_KEY), "hint_for", None)
        where += hint(f.name, key) if hint is not None and "." not in key else ""
    if near:
        return InputError(
            f"{where}; did you mean {' or '.join(near)}? (`oxbench methods {config.name}` lists "
            f"its {len(known)} settings)"
        )
    return InputError(f"{where}; its settings: {', '.join(sorted(known))}")


def _typed(f: dataclasses.Field[Any], key: str, value: object) -> object:
    """``value`` for field ``f`` as its spec parses or checks it (JSON-or-text without a spec)."""
    spec = f.metadata.get(SPEC_KEY)
    if spec is not None:
        return spec.coerce(key, value)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _replace(config: Any, changes: dict[str, Any], what: str) -> Any:
    try:
        return dataclasses.replace(config, **changes)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"{what}: {exc}") from None


def preset_label(method: str, settings: Mapping[str, Any] | None) -> str:
    """:func:`default_label` against the registered preset ``method`` (its input settings left out);
    the name alone when no preset of that name is registered."""
    from oxbench.records import default_label
    from oxbench.schema import describe

    if method not in METHODS:
        return method
    preset = METHODS.get(method)
    inputs = {row.name for row in describe(preset) if row.input}
    return default_label(method, settings, preset.to_dict(), inputs=inputs)
