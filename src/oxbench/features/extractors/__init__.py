"""Local-feature extractors by name: the registry, the text that selects one, and the record's
dict that rebuilds one.

Each extractor is one module of this package (as hloc keeps ``extractors/*.py``) that registers an
:class:`ExtractorEntry` under its name; the mechanism is :class:`oxbench.registry.Registry`. A method
setting of local features (``features`` of bag of words, HE, ASMK) takes

=====================  ========================================================================
text                   local features
=====================  ========================================================================
``rootsift``           RootSIFT with OpenCV (:class:`~oxbench.features.sift.SiftConfig` defaults)
``sift``               plain SIFT with OpenCV
``h5:PATH``            read from hloc's ``features.h5`` (:mod:`oxbench.formats.local_features`)
``npz:FOLDER``         read from a folder of ``<image name>.npz``
=====================  ========================================================================

through :data:`LOCAL_FEATURES_SPEC` (``--set features=h5:feats.h5``), and a record's
``to_dict()`` (a mapping with a ``kind``) rebuilds the same extractor
(:func:`local_extractor_from_dict`), so a run can be repeated from its ``config.json``.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from oxbench.errors import InputError
from oxbench.features.local import LocalExtractor
from oxbench.registry import GROUPS, Registry
from oxbench.schema import Spec, _Refusal

__all__ = [
    "LOCAL_EXTRACTORS",
    "LOCAL_FEATURES_SPEC",
    "ExtractorEntry",
    "LocalFeaturesSetting",
    "local_extractor",
    "local_extractor_from_dict",
    "register_local_extractor",
]


@dataclass(frozen=True)
class ExtractorEntry:
    """One named local feature.

    Attributes:
        name: what ``--set features=NAME[:ARGUMENT]`` says.
        about: one line for listings.
        kind: the ``kind`` its configs' ``to_dict()`` records (several names may share one).
        from_text: the extractor from the text after ``NAME:`` (empty when there is none).
        from_dict: the extractor from its ``to_dict()`` (a run record's).
        argument: what the text after ``NAME:`` is (``""``: it takes none).
    """

    name: str
    about: str
    kind: str
    from_text: Callable[[str], LocalExtractor]
    from_dict: Callable[[Mapping[str, Any]], LocalExtractor]
    argument: str = ""


def _load_extractors() -> None:
    for info in pkgutil.iter_modules(__path__, __name__ + "."):
        if not info.name.rsplit(".", 1)[-1].startswith("_"):
            importlib.import_module(info.name)


def _adopt_plugin(name: str, obj: Any) -> object:
    """Register what an ``oxbench.local_features`` entry point names: an :class:`ExtractorEntry`, or
    a class (callable) whose instances are :class:`~oxbench.features.local.LocalExtractor` configs,
    built with no argument from text (``--set features=NAME``) and from its ``to_dict()``."""
    if isinstance(obj, ExtractorEntry):
        return register_local_extractor(obj)
    if not callable(obj):
        raise InputError(f"local feature plugin {name!r}: {obj!r} is neither an entry nor a class")
    sample = obj()
    if not isinstance(sample, LocalExtractor):
        raise InputError(f"local feature plugin {name!r}: {obj!r}() is not a local extractor")

    def from_text(argument: str) -> LocalExtractor:
        if argument:
            raise InputError(f"local features {name!r} take no argument, got {argument!r}")
        return obj()  # type: ignore[no-any-return]

    def from_dict(values: Mapping[str, Any]) -> LocalExtractor:
        return obj(**{k: v for k, v in values.items() if k != "kind"})  # type: ignore[no-any-return]

    doc = (getattr(obj, "__doc__", None) or "").strip().split("\n", 1)[0]
    kind = str(sample.to_dict().get("kind", name))
    return register_local_extractor(ExtractorEntry(name, doc, kind, from_text, from_dict))


#: Every named local feature, by name (each module of this package registers its own; plugins
#: through the ``oxbench.local_features`` entry points).
LOCAL_EXTRACTORS: Registry[ExtractorEntry] = Registry(
    "local feature", loader=_load_extractors, group=GROUPS["local_features"], adopt=_adopt_plugin
)


def register_local_extractor(entry: ExtractorEntry) -> ExtractorEntry:
    """Register ``entry`` under its name (an extractor module calls it at import).

    Raises:
        ValueError: the name is taken.
    """
    return LOCAL_EXTRACTORS.register(entry.name, entry)


def local_extractor(text: str) -> LocalExtractor:
    """The extractor that ``text`` names: ``rootsift``, ``sift``, ``h5:PATH``, ``npz:FOLDER``.

    Raises:
        InputError: an unknown name (with the known ones), an argument the extractor refuses.
    """
    name, colon, argument = text.strip().partition(":")
    entry = LOCAL_EXTRACTORS.get(name.strip())
    if colon and not entry.argument:
        raise InputError(f"local feature {entry.name} takes no argument, got {text!r}")
    if not colon and entry.argument:
        raise InputError(f"local feature {entry.name} needs {entry.name}:{entry.argument}")
    return entry.from_text(argument.strip())


def local_extractor_from_dict(settings: Mapping[str, Any]) -> LocalExtractor:
    """The extractor a record's ``features`` dict describes (the inverse of ``to_dict()``).

    Raises:
        InputError: no or an unknown ``kind``, or settings the extractor refuses.
    """
    kind = settings.get("kind") if isinstance(settings, Mapping) else None
    for name in LOCAL_EXTRACTORS.names():
        entry = LOCAL_EXTRACTORS.get(name)
        if entry.kind == kind:
            return entry.from_dict(settings)
    kinds = sorted({LOCAL_EXTRACTORS.get(n).kind for n in LOCAL_EXTRACTORS.names()})
    raise InputError(f"local features of unknown kind {kind!r}; known kinds: {', '.join(kinds)}")


class LocalFeaturesSetting(Spec):
    """The schema of a local-features setting: text names an extractor (:func:`local_extractor`),
    a mapping is a record's ``to_dict()`` (:func:`local_extractor_from_dict`), an extractor object
    (a preset's ``SiftConfig(...)``) is taken as it is."""

    _kind: ClassVar[str] = "local features"

    def _from_text(self, text: str) -> Any:
        try:
            return local_extractor(text)
        except InputError as exc:
            return _Refusal(str(exc))

    def _check(self, value: Any) -> Any:
        if isinstance(value, Mapping):
            try:
                return local_extractor_from_dict(value)
            except InputError as exc:
                return _Refusal(str(exc))
            except TypeError as exc:  # an unexpected key in the record
                return _Refusal(f"not the settings of its kind ({exc})")
        if isinstance(value, LocalExtractor):
            return value
        return _Refusal("expected local features (a name such as rootsift, h5:PATH, npz:FOLDER)")

    def describe(self) -> str:
        return "; ".join(
            f"{n}:{LOCAL_EXTRACTORS.get(n).argument}" if LOCAL_EXTRACTORS.get(n).argument else n
            for n in LOCAL_EXTRACTORS.names()
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalFeaturesSetting)

    def __hash__(self) -> int:
        return hash(LocalFeaturesSetting)


#: The one spec of every ``features`` setting that takes local features.
LOCAL_FEATURES_SPEC = LocalFeaturesSetting()
