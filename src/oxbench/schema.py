"""Typed settings, declared once: the parser of a string and the check of a value come from there.

A setting states its kind and range in one :class:`Spec` (``Int(lo=1)``, ``Float(lo=0, lo_open=True)``,
``Choice("none", "aqe")``, ...). The same spec turns a string from the command line into a typed value
(:meth:`Spec.parse`: ``--set qe_alpha=3``, ``--lr 1e-3``) and checks a value that is already typed
(:meth:`Spec.check`: a preset's value, a dataclass field). Every refusal is one
:class:`~oxbench.errors.InputError` line naming the setting::

    setting qe_alpha: expected a finite number, got 'abc'

Floats are finite unless the spec allows infinity, and NaN never passes a range: every bound is
written as ``not (lo < x)``, which is true for NaN.

On a frozen dataclass a spec goes into the field's metadata with :func:`setting`, and
:func:`validate` (called from ``__post_init__``) checks every field that has one::

    @dataclass(frozen=True)
    class QeConfig:
        qe_k: int = setting(10, Int(lo=1, hi=10_000), doc="neighbours averaged")
        qe_alpha: float = setting(3.0, Float(lo=0), doc="weight exponent")

        def __post_init__(self) -> None:
            validate(self)

    parse(QeConfig, "qe_alpha", "abc")   # InputError: setting qe_alpha: expected a finite number, got 'abc'
    describe(QeConfig)                   # [SettingInfo(name='qe_k', kind='int', default=10, ...), ...]

Nested configs are reached with dotted names (``features.max_side``) by :func:`parse`,
:func:`spec_of` and :func:`describe`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from oxbench.errors import InputError

__all__ = [
    "Bool",
    "Choice",
    "Float",
    "FloatTuple",
    "Int",
    "Names",
    "Optional",
    "PathSetting",
    "SeedList",
    "SettingInfo",
    "Size",
    "Spec",
    "Str",
    "coerce",
    "describe",
    "input_paths",
    "is_seed_setting",
    "parse",
    "parse_seeds",
    "seed_settings",
    "setting",
    "spec_of",
    "validate",
]

#: Key of a field's metadata that holds its :class:`Spec`.
SPEC_KEY = "oxbench.spec"
#: Key of a field's metadata that holds its one-line description.
DOC_KEY = "oxbench.doc"
#: Key of a field's metadata that marks a setting naming or laying out an input (see :func:`setting`).
INPUT_KEY = "oxbench.input"

_INT_TEXT = re.compile(r"[+-]?[0-9]+\Z")
# Python's float() also takes "1_0", "nan", " inf ", "infinity": only the plain decimal forms here
_FLOAT_TEXT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\Z")
_INF_TEXT = re.compile(r"[+-]?inf(inity)?\Z", re.IGNORECASE)
_NAN_TEXT = re.compile(r"[+-]?nan\Z", re.IGNORECASE)
_NAME_TEXT = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}\Z")
#: Longest string a setting takes from the command line before it is looked at.
_MAX_TEXT = 4096


def _show(raw: Any) -> str:
    """``raw`` for an error message: quoted, one line, at most ~60 characters."""
    text = repr(raw)
    return text if len(text) <= 60 else text[:57] + "..."


def _fail(name: str, message: str, what: str) -> InputError:
    return InputError(f"{what} {name}: {message}")


def _num(x: float) -> str:
    """A bound as the user would write it (``0``, ``0.5``, ``1e+30``)."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(x)


class Spec:
    """The kind and range of one setting.

    Subclasses implement :meth:`_from_text` (a stripped string to a value) and :meth:`_check`
    (a typed value to its normal form, or an error message). ``what`` in the public methods is the
    word before the name in errors: ``setting`` for method settings, ``option`` for CLI options.
    """

    _kind: ClassVar[str] = "value"

    @property
    def kind(self) -> str:
        """The kind's name, for listings: ``int``, ``float``, ``choice`` ..."""
        return self._kind

    def parse(self, name: str, raw: str, *, what: str = "setting") -> Any:
        """The typed value of the string ``raw`` (from ``--set name=raw`` or an option).

        Raises:
            InputError: one line naming ``name``: the text is not of this kind or out of range.
        """
        if not isinstance(raw, str):
            raise _fail(name, f"expected text to parse, got {type(raw).__name__}", what)
        if len(raw) > _MAX_TEXT:
            raise _fail(name, f"value is {len(raw):,} characters long; at most {_MAX_TEXT:,}", what)
        if "\x00" in raw:
            raise _fail(name, "value contains a NUL character", what)
        result = self._from_text(raw.strip())
        if isinstance(result, _Refusal):
            raise _fail(name, f"{result.message}, got {_show(raw)}", what)
        return self.check(name, result, what=what)

    def check(self, name: str, value: Any, *, what: str = "setting") -> Any:
        """``value`` in its normal form (``numpy.float32`` to ``float``, a list to a tuple).

        Raises:
            InputError: one line naming ``name``: wrong type, not finite, or out of range.
        """
        result = self._check(value)
        if isinstance(result, _Refusal):
            raise _fail(name, f"{result.message}, got {_show(value)}", what)
        return result

    def coerce(self, name: str, value: Any, *, what: str = "setting") -> Any:
        """:meth:`parse` for a string, :meth:`check` for anything else."""
        return (
            self.parse(name, value, what=what)
            if isinstance(value, str)
            else self.check(name, value, what=what)
        )

    def meta(self, doc: str = "") -> dict[str, Any]:
        """Field metadata holding this spec: ``field(default=3.0, metadata=Float(lo=0).meta())``."""
        return {SPEC_KEY: self, DOC_KEY: doc}

    def describe(self) -> str:
        """The accepted values in words (``> 0``, ``one of none, aqe``), empty when any of its kind."""
        return ""

    # subclass hooks --------------------------------------------------------------------------
    def _from_text(self, text: str) -> Any:
        return text

    def _check(self, value: Any) -> Any:  # pragma: no cover - every subclass overrides
        raise NotImplementedError


@dataclass(frozen=True)
class _Refusal:
    message: str


def _range_refusal(
    x: float, lo: float | None, hi: float | None, lo_open: bool, hi_open: bool
) -> _Refusal | None:
    # written so that NaN fails every bound: "not (lo < x)" is true for NaN
    if lo is not None and (not (lo < x) if lo_open else not (lo <= x)):
        return _Refusal(f"must be {_range_words(lo, hi, lo_open, hi_open)}")
    if hi is not None and (not (x < hi) if hi_open else not (x <= hi)):
        return _Refusal(f"must be {_range_words(lo, hi, lo_open, hi_open)}")
    return None


def _range_words(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{_num(lo)}, {_num(hi)}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {_num(lo)}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {_num(hi)}"
    return ""


@dataclass(frozen=True)
class Int(Spec):
    """A whole number in ``[lo, hi]`` (either bound optional, ``*_open`` for a strict bound).

    Text is decimal digits with an optional sign (``1_0``, ``1.5``, ``1e3``, ``true`` are refused);
    a value must be an ``int`` or numpy integer, never a ``bool`` or a float.
    """

    lo: int | None = None
    hi: int | None = None
    lo_open: bool = False
    hi_open: bool = False
    _kind: ClassVar[str] = "int"

    def _from_text(self, text: str) -> Any:
        if not _INT_TEXT.match(text):
            return _Refusal("expected a whole number")
        if len(text) > 40:
            return _Refusal("number too large")
        return int(text)

    def _check(self, value: Any) -> Any:
        if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
            return _Refusal("expected a whole number")
        x = int(value)
        refusal = _range_refusal(x, self.lo, self.hi, self.lo_open, self.hi_open)
        return refusal if refusal is not None else x

    def describe(self) -> str:
        return _range_words(self.lo, self.hi, self.lo_open, self.hi_open)


@dataclass(frozen=True)
class Size(Int):
    """A whole number whose upper bound keeps memory in reach (a count of negatives, a dimension).

    Like :class:`Int`, but ``hi`` is required and a value above it is refused with the reason, so a
    typo like ``--neg-num 1000000000`` is one line instead of a ``MemoryError``.
    """

    hi: int | None = None
    _kind: ClassVar[str] = "size"

    def __post_init__(self) -> None:
        if self.hi is None:
            raise TypeError("Size needs an upper bound (hi=...)")

    def _check(self, value: Any) -> Any:
        result = super()._check(value)
        if isinstance(result, _Refusal) and result.message.startswith("must be"):
            return _Refusal(f"{result.message} (a bound that keeps memory in reach)")
        return result


@dataclass(frozen=True)
class Float(Spec):
    """A real number, finite unless ``allow_inf``, in a range with open or closed bounds.

    NaN is always refused. Text is a plain decimal (``0.5``, ``1e-3``, ``-2``); ``inf`` parses only
    when ``allow_inf``. A value may be an ``int``, ``float`` or numpy number, never a ``bool``.
    """

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    allow_inf: bool = False
    _kind: ClassVar[str] = "float"

    def _expected(self) -> str:
        return "expected a number (or inf)" if self.allow_inf else "expected a finite number"

    def _from_text(self, text: str) -> Any:
        if _FLOAT_TEXT.match(text) or (self.allow_inf and _INF_TEXT.match(text)):
            return float(text)
        return _Refusal(self._expected())

    def _check(self, value: Any) -> Any:
        if isinstance(value, bool | np.bool_) or not isinstance(
            value, int | float | np.integer | np.floating
        ):
            return _Refusal(self._expected())
        try:
            x = float(value)
        except OverflowError:  # an int beyond float range
            return _Refusal(self._expected())
        if math.isnan(x) or (math.isinf(x) and not self.allow_inf):
            return _Refusal(self._expected())
        refusal = _range_refusal(x, self.lo, self.hi, self.lo_open, self.hi_open)
        return refusal if refusal is not None else x

    def describe(self) -> str:
        words = _range_words(self.lo, self.hi, self.lo_open, self.hi_open)
        return (
            f"{words}, inf allowed"
            if self.allow_inf and words
            else ("inf allowed" if self.allow_inf else words)
        )


_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})


@dataclass(frozen=True)
class Bool(Spec):
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``, any case); a value must be a ``bool``."""

    _kind: ClassVar[str] = "bool"

    def _from_text(self, text: str) -> Any:
        low = text.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        return _Refusal("expected true or false")

    def _check(self, value: Any) -> Any:
        if isinstance(value, bool | np.bool_):
            return bool(value)
        return _Refusal("expected true or false")

    def describe(self) -> str:
        return "true or false"


class Choice(Spec):
    """One of a fixed list of words (``Choice("none", "aqe", "alpha-qe")``), compared exactly."""

    _kind: ClassVar[str] = "choice"

    def __init__(self, *choices: str, renamed: Mapping[str, str] | None = None) -> None:
        if not choices or not all(isinstance(c, str) for c in choices):
            raise TypeError("Choice takes one or more strings")
        self.choices: tuple[str, ...] = tuple(choices)
        #: values of earlier versions and their names now (refused, naming the new one)
        self.renamed: dict[str, str] = dict(renamed or {})

    def __repr__(self) -> str:
        return f"Choice{self.choices!r}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Choice) and other.choices == self.choices

    def __hash__(self) -> int:
        return hash(self.choices)

    def _words(self) -> str:
        return ", ".join(self.choices)

    def _check(self, value: Any) -> Any:
        if isinstance(value, str) and value in self.choices:
            return value
        if isinstance(value, str) and value in self.renamed:
            return _Refusal(f"{value!r} is now {self.renamed[value]!r}")
        return _Refusal(f"expected one of {self._words()}")

    def describe(self) -> str:
        return f"one of {self._words()}"


class Group:
    """Base of a group of settings nested in a config under one name (``vocabulary.size``,
    ``he.ht``): a frozen dataclass whose every field is declared with :func:`setting`."""

    def to_dict(self) -> dict[str, Any]:
        """``{setting: value}``, JSON-able (what records and digests hold)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Any:
        """The group a record's ``to_dict()`` describes.

        Raises:
            InputError: a setting the group does not have, or a value its spec refuses.
        """
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        extra = sorted(set(values) - known)
        if extra:
            raise InputError(f"no setting {extra[0]!r} (its settings: {', '.join(sorted(known))})")
        return cls(**values)


class KindSettings(Group):
    """Base of one kind of a :class:`Kinds` setting: a frozen dataclass of the kind's own settings
    (every field declared with :func:`setting`) with the name it is chosen by (:attr:`kind`)."""

    kind: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": name, setting: value, ...}``, JSON-able (what records and digests hold)."""
        return {"kind": self.kind, **super().to_dict()}

    def __str__(self) -> str:
        """The kind's name, as ``--set`` chooses it (its settings are listed one by one)."""
        return self.kind


class Kinds(Spec):
    """One of several named kinds, each with settings of its own only (as faiss names an index by
    one factory string): ``search=faiss-ivfpq`` then ``search.nlist=1024``; a sub-setting of
    another kind is refused in one line naming the kind that has it.

    Text names a kind (its defaults); a mapping is a record's ``to_dict()`` (``{"kind": ...}``); an
    instance of one of the kinds is taken as it is.

    Args:
        label: what the setting chooses, for listings and messages (``search``).
        kinds: the :class:`KindSettings` dataclasses, in the order listings show them.
    """

    def __init__(self, label: str, *kinds: type[KindSettings]) -> None:
        names = [k.kind for k in kinds]
        if not kinds or len(set(names)) != len(names) or not all(names):
            raise TypeError("Kinds takes kinds with distinct, non-empty names")
        self.label = label
        self.kinds: dict[str, type[KindSettings]] = dict(zip(names, kinds, strict=True))

    @property
    def kind(self) -> str:
        return f"{self.label} kind"

    def __repr__(self) -> str:
        return f"Kinds({self.label!r}, {', '.join(self.kinds)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Kinds) and (other.label, other.kinds) == (self.label, self.kinds)

    def __hash__(self) -> int:
        return hash((self.label, tuple(self.kinds)))

    def _words(self) -> str:
        return ", ".join(self.kinds)

    def _from_text(self, text: str) -> Any:
        cls = self.kinds.get(text)
        return cls() if cls is not None else _Refusal(f"expected one of {self._words()}")

    def _check(self, value: Any) -> Any:
        if isinstance(value, tuple(self.kinds.values())):
            return value
        if isinstance(value, str):
            return self._from_text(value.strip())
        if isinstance(value, Mapping):
            cls = self.kinds.get(value.get("kind"))  # type: ignore[arg-type]
            if cls is None:
                return _Refusal(f"expected a record of one of {self._words()}")
            try:
                return cls.from_dict({k: v for k, v in value.items() if k != "kind"})
            except InputError as exc:
                return _Refusal(f"{cls.kind}: {exc.problem}")
        return _Refusal(f"expected one of {self._words()}")

    def describe(self) -> str:
        return f"one of {self._words()}"

    def unknown_setting(self, value: Any, key: str, method: str) -> str:
        """The one line for ``--set FIELD.X`` where the chosen kind has no ``X``: the kinds that
        have it (and how to switch), else the chosen kind's own settings."""
        field, _, sub = key.partition(".")
        sub = sub.split(".", 1)[0]
        own = [f.name for f in dataclasses.fields(value)]
        others = [
            name
            for name, cls in self.kinds.items()
            if name != value.kind and sub in {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        ]
        mine = ", ".join(f"{field}.{n}" for n in own) or "none"
        if others:
            return (
                f"method {method}: {key} is a setting of {self.label} kind {' and '.join(others)}, "
                f"and {method} has {field}={value.kind} (whose settings are {mine}); switch with "
                f"--set {field}={others[0]}"
            )
        return (
            f"unknown setting {key!r} of {self.label} kind {value.kind} ({method}); its settings: "
            f"{mine} (kinds: {self._words()})"
        )


@dataclass(frozen=True)
class Str(Spec):
    """Text of ``min_len`` to ``max_len`` characters, without NUL or line breaks; with
    ``pattern``, text the regular expression matches in full (``pattern_doc`` says what it
    accepts, in messages)."""

    min_len: int = 0
    max_len: int = 256
    pattern: str | None = None
    pattern_doc: str = ""
    _kind: ClassVar[str] = "str"

    def _check(self, value: Any) -> Any:
        if not isinstance(value, str):
            return _Refusal("expected text")
        if "\x00" in value or "\n" in value or "\r" in value:
            return _Refusal("text must not contain NUL or line breaks")
        if not (self.min_len <= len(value) <= self.max_len):
            return _Refusal(f"expected {self.min_len} to {self.max_len} characters")
        if self.pattern is not None and not re.fullmatch(self.pattern, value, re.ASCII):
            return _Refusal(f"expected {self.pattern_doc or self.pattern}")
        return value

    def describe(self) -> str:
        if self.pattern is not None:
            return self.pattern_doc or f"text matching {self.pattern}"
        return f"{self.min_len}..{self.max_len} characters"


#: A compute device: ``auto`` (CUDA when torch sees a GPU), ``cpu``, ``cuda`` or ``cuda:<n>``.
DEVICE = Str(
    1, 32, pattern=r"auto|cpu|cuda(:[0-9]{1,3})?", pattern_doc="auto, cpu, cuda or cuda:<n>"
)


@dataclass(frozen=True)
class Names(Spec):
    """An ordered tuple of at most ``max_len`` names (``[a-z0-9][a-z0-9._-]*``, at most 64
    characters each; distinct unless ``repeats``): re-ranking stages, say. Text is comma-separated
    (``spatial,aqe-verified``); ``none`` or nothing is the empty tuple. Whether each name exists is
    its registry's check.
    """

    max_len: int = 16
    repeats: bool = False
    _kind: ClassVar[str] = "names"

    def _from_text(self, text: str) -> Any:
        text = text.strip()
        if text in ("", "none"):
            return ()
        return tuple(p.strip() for p in text.split(","))

    def _check(self, value: Any) -> Any:
        if isinstance(value, str):
            value = self._from_text(value)
        if not isinstance(value, tuple | list):
            return _Refusal("expected comma-separated names")
        if len(value) > self.max_len:
            return _Refusal(f"expected at most {self.max_len} names")
        for v in value:
            if not isinstance(v, str) or not _NAME_TEXT.match(v):
                return _Refusal(f"{v!r} is not a name (lower-case letters, digits, '.', '_', '-')")
        if not self.repeats and len(set(value)) != len(value):
            return _Refusal("a name is repeated")
        return tuple(value)

    def describe(self) -> str:
        return f"comma-separated names (at most {self.max_len}), or none"


@dataclass(frozen=True)
class PathSetting(Spec):
    """A file or folder path (kept as text; nothing is opened): non-empty, no NUL, bounded length."""

    max_len: int = 4096
    _kind: ClassVar[str] = "path"

    def _check(self, value: Any) -> Any:
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str):
            return _Refusal("expected a path")
        if not value or "\x00" in value or len(value) > self.max_len:
            return _Refusal(f"expected a path of 1 to {self.max_len} characters without NUL")
        return value

    def describe(self) -> str:
        return "a path"


@dataclass(frozen=True)
class Optional(Spec):
    """``None`` (text ``none`` or ``null``, any case) or a value of ``inner``."""

    inner: Spec = dataclasses.field(default_factory=Str)

    @property
    def kind(self) -> str:
        return f"{self.inner.kind} or none"

    def _from_text(self, text: str) -> Any:
        if text.lower() in ("none", "null"):
            return None
        return self.inner._from_text(text)

    def _check(self, value: Any) -> Any:
        return None if value is None else self.inner._check(value)

    def describe(self) -> str:
        inner = self.inner.describe()
        return f"{inner}, or none" if inner else "or none"


def _comma_items(parts: list[str], item: Spec, message: str) -> tuple[Any, ...] | _Refusal:
    """Each of ``parts`` parsed by ``item`` (a list's text split at commas), or ``message``."""
    out = []
    for p in parts:
        v = item._from_text(p)
        if isinstance(v, _Refusal):
            return _Refusal(message)
        out.append(v)
    return tuple(out)


def _as_items(value: Any) -> list[Any] | tuple[Any, ...] | None:
    """A list's items (a 1-D array's too), or ``None`` when ``value`` is not a list."""
    if isinstance(value, np.ndarray):
        value = value.tolist() if value.ndim == 1 else None
    return value if isinstance(value, tuple | list) else None


@dataclass(frozen=True)
class FloatTuple(Spec):
    """A tuple of ``min_len`` to ``max_len`` numbers, each checked by ``item``.

    Text is comma-separated, optionally in brackets or parentheses: ``0.5,1``, ``[0.5, 1]``.
    """

    item: Float = dataclasses.field(default_factory=Float)
    min_len: int = 1
    max_len: int = 64
    _kind: ClassVar[str] = "floats"

    def _from_text(self, text: str) -> Any:
        if len(text) >= 2 and text[0] + text[-1] in ("[]", "()"):
            text = text[1:-1]
        parts = [p.strip() for p in text.split(",")] if text.strip() else []
        if parts and parts[-1] == "":  # a trailing comma, as in Python's "(0.5,)"
            parts.pop()
        return _comma_items(parts, self.item, "expected comma-separated numbers")

    def _check(self, value: Any) -> Any:
        value = _as_items(value)
        if value is None:
            return _Refusal("expected a list of numbers")
        if not (self.min_len <= len(value) <= self.max_len):
            return _Refusal(f"expected {self.min_len} to {self.max_len} numbers")
        out = []
        for i, v in enumerate(value):
            r = self.item._check(v)
            if isinstance(r, _Refusal):
                return _Refusal(f"item {i + 1}: {r.message}")
            out.append(r)
        return tuple(out)

    def describe(self) -> str:
        item = self.item.describe()
        count = f"{self.min_len}..{self.max_len} numbers"
        return f"{count}, each {item}" if item else count


#: Most seeds one seed group may run (``--seeds``): each seed is a whole run of the learned steps.
MAX_SEEDS = 100
#: The range of one seed (what numpy's and faiss's generators take).
SEED_RANGE = Int(lo=0, hi=2**32 - 1)


@dataclass(frozen=True)
class SeedList(Spec):
    """Distinct seeds, in the order given: ``0,1,2`` (the text of ``oxbench run --seeds``).

    Each is a whole number in ``[0, 2**32 - 1]``; the list holds 1 to ``max_len`` seeds, none
    repeated (a repeated seed would count one run twice in a spread).
    """

    item: Int = SEED_RANGE
    max_len: int = MAX_SEEDS
    _kind: ClassVar[str] = "seeds"

    def _from_text(self, text: str) -> Any:
        parts = [p.strip() for p in text.split(",")] if text.strip() else []
        return _comma_items(parts, self.item, "expected comma-separated whole numbers (0,1,2)")

    def _check(self, value: Any) -> Any:
        value = _as_items(value)
        if value is None:
            return _Refusal("expected a list of seeds")
        if not value:
            return _Refusal("expected at least one seed")
        if len(value) > self.max_len:
            return _Refusal(f"expected at most {self.max_len} seeds, got {len(value):,}")
        out: list[int] = []
        for i, v in enumerate(value):
            r = self.item._check(v)
            if isinstance(r, _Refusal):
                return _Refusal(f"seed {i + 1}: {r.message}")
            if r in out:
                return _Refusal(f"seed {r} is given twice")
            out.append(r)
        return tuple(out)

    def describe(self) -> str:
        return f"1..{self.max_len} distinct seeds, each {self.item.describe()}"


def parse_seeds(text: str, *, option: str = "--seeds") -> tuple[int, ...]:
    """The seeds of ``oxbench run --seeds 0,1,2`` (:class:`SeedList`), or one line naming the option.

    Raises:
        InputError: empty, not whole numbers, negative or above ``2**32 - 1``, a seed given twice,
            more than :data:`MAX_SEEDS` seeds, or text too long to look at.

    Example:
        >>> parse_seeds("0, 1,2")
        (0, 1, 2)
    """
    return SeedList().parse(option, text, what="option")


# --- dataclass fields ---------------------------------------------------------------------------


def setting(
    default: Any = dataclasses.MISSING,
    spec: Spec | None = None,
    *,
    doc: str = "",
    input: bool = False,
    **kwargs: Any,
) -> Any:
    """A dataclass field whose metadata holds ``spec`` and ``doc``.

    ``qe_alpha: float = setting(3.0, Float(lo=0), doc="weight exponent of alpha-QE")``. ``input``
    marks a setting that says where or how an input is read (a descriptor file, the array inside
    it), not what the method does: a run's default label leaves it out. Further keyword arguments go
    to :func:`dataclasses.field` (``default_factory``, ``compare`` ...).
    """
    if spec is None:
        raise TypeError("setting() needs a spec")
    metadata = {**kwargs.pop("metadata", {}), SPEC_KEY: spec, DOC_KEY: doc, INPUT_KEY: input}
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata=metadata, **kwargs)
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def _fields(cls_or_instance: Any) -> dict[str, dataclasses.Field[Any]]:
    if not dataclasses.is_dataclass(cls_or_instance):
        raise TypeError(f"{cls_or_instance!r} is not a dataclass")
    return {f.name: f for f in dataclasses.fields(cls_or_instance)}


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def validate(
    instance: Any,
    *,
    what: str = "setting",
    normalize: bool = True,
    label: Callable[[str], str] | None = None,
) -> None:
    """Check every field of the dataclass ``instance`` that has a spec (call from ``__post_init__``).

    With ``normalize``, a value whose normal form has another type (a list given for a tuple, a
    numpy number for a float) is replaced by it, on frozen dataclasses too, so the instance's
    ``to_dict`` and digest do not depend on how the value was given. ``label`` maps a field name to
    the name errors show (``lambda n: "--" + n.replace("_", "-")`` for command-line options).

    Raises:
        InputError: the first field whose value its spec refuses, named in one line.
    """
    for name, f in _fields(instance).items():
        spec = f.metadata.get(SPEC_KEY)
        if spec is None:
            continue
        value = getattr(instance, name)
        checked = spec.check(label(name) if label else name, value, what=what)
        if normalize and type(checked) is not type(value):
            object.__setattr__(instance, name, checked)


def spec_of(cls_or_instance: Any, name: str) -> Spec:
    """The spec of setting ``name`` (dotted for a nested config: ``features.max_side``).

    Raises:
        InputError: no such setting, or it declares no spec.
    """
    head, _, rest = name.partition(".")
    fields = _fields(cls_or_instance)
    if head not in fields:
        raise InputError(f"unknown setting {name!r}")
    f = fields[head]
    if rest:
        nested = (
            getattr(cls_or_instance, head) if not isinstance(cls_or_instance, type) else _default(f)
        )
        if not dataclasses.is_dataclass(nested):
            raise InputError(f"unknown setting {name!r}: {head} has no sub-settings")
        try:
            return spec_of(nested, rest)
        except InputError:
            raise InputError(f"unknown setting {name!r}") from None
    spec = f.metadata.get(SPEC_KEY)
    if spec is None:
        raise InputError(f"setting {name!r} takes no value from text")
    return spec


def parse(
    cls_or_instance: Any, name: str, raw: str, *, what: str = "setting", label: str | None = None
) -> Any:
    """The typed value of setting ``name`` of a dataclass from the string ``raw``.

    ``parse(QeConfig, "qe_k", "10") == 10``; dotted names reach nested configs. ``label`` is the
    name errors show (default ``name``; ``"--lr"`` for an option).

    Raises:
        InputError: unknown setting, or the text is not a valid value (names the setting).
    """
    return spec_of(cls_or_instance, name).parse(label or name, raw, what=what)


def coerce(
    cls_or_instance: Any, name: str, value: Any, *, what: str = "setting", label: str | None = None
) -> Any:
    """:func:`parse` for a string, the spec's check for a typed value (a preset's, JSON's)."""
    return spec_of(cls_or_instance, name).coerce(label or name, value, what=what)


@dataclass(frozen=True)
class SettingInfo:
    """One row of :func:`describe`: what a setting is called, takes and defaults to."""

    name: str
    kind: str
    default: Any
    range: str
    doc: str
    input: bool = False


def describe(cls_or_instance: Any, *, prefix: str = "") -> list[SettingInfo]:
    """Every setting of a dataclass with a spec, in field order, nested configs as dotted names.

    The default is the instance's value when given an instance, else the field's default
    (``dataclasses.MISSING`` when it has none).
    """
    rows: list[SettingInfo] = []
    is_cls = isinstance(cls_or_instance, type)
    for name, f in _fields(cls_or_instance).items():
        value = _default(f) if is_cls else getattr(cls_or_instance, name)
        spec = f.metadata.get(SPEC_KEY)
        if spec is None:
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                rows.extend(describe(value, prefix=f"{prefix}{name}."))
            continue
        rows.append(
            SettingInfo(
                f"{prefix}{name}",
                spec.kind,
                value,
                spec.describe(),
                f.metadata.get(DOC_KEY, ""),
                bool(f.metadata.get(INPUT_KEY, False)),
            )
        )
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            rows.extend(describe(value, prefix=f"{prefix}{name}."))  # a whole value and its parts
    return rows


def input_paths(instance: Any) -> dict[str, str]:
    """Every set path setting of a dataclass declared ``input`` (:func:`setting`), by field name:
    the files a config reads, whose content digests a run records."""
    out: dict[str, str] = {}
    for name, f in _fields(instance).items():
        spec = f.metadata.get(SPEC_KEY)
        inner = spec.inner if isinstance(spec, Optional) else spec
        value = getattr(instance, name)
        if f.metadata.get(INPUT_KEY) and isinstance(inner, PathSetting) and value:
            out[name] = value
    return out


def is_seed_setting(name: str) -> bool:
    """Whether a (dotted) setting name names a seed: the one naming rule for every random or
    learned step is ``seed`` in the step's group (``vocabulary.seed``, ``he.seed``,
    ``search.seed``, ``descriptor.seed``, ``descriptor.vocabulary.seed``)."""
    return name.rsplit(".", 1)[-1] == "seed"


def seed_settings(cls_or_instance: Any) -> dict[str, int]:
    """Every seed setting of a config (:func:`is_seed_setting`, nested as dotted names) with its
    value, in field order: what a run records as its ``seeds``."""
    return {
        row.name: int(row.default)
        for row in describe(cls_or_instance)
        if is_seed_setting(row.name) and row.kind == "int" and isinstance(row.default, int)
    }
