"""The settings schema: one spec parses text and checks values, every refusal one named line."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.errors import InputError
from oxbench.schema import (
    Bool,
    Choice,
    Float,
    FloatTuple,
    Int,
    Optional,
    PathSetting,
    Size,
    Str,
    coerce,
    describe,
    parse,
    setting,
    spec_of,
    validate,
)


@dataclass(frozen=True)
class Inner:
    max_side: int = setting(1024, Int(lo=16, hi=8192), doc="longer image side")

    def __post_init__(self) -> None:
        validate(self)


@dataclass(frozen=True)
class Toy:
    qe_k: int = setting(10, Int(lo=1, hi=10_000), doc="neighbours averaged")
    qe_alpha: float = setting(3.0, Float(lo=0), doc="weight exponent")
    ratio: float = setting(0.8, Float(lo=0, hi=1, lo_open=True), doc="Lowe ratio")
    gamma: float = setting(3.0, Float(lo=0, lo_open=True, allow_inf=True))
    dba: bool = setting(False, Bool())
    qe: str = setting("none", Choice("none", "aqe", "alpha-qe"))
    label: str = setting("x", Str(min_len=1, max_len=8))
    weights: str | None = setting(None, Optional(PathSetting()))
    scales: tuple[float, ...] = setting(
        (1.0,), FloatTuple(Float(lo=0.1, hi=4), min_len=1, max_len=4)
    )
    neg_num: int = setting(5, Size(lo=1, hi=1000))
    features: Inner = dataclasses.field(default_factory=Inner)
    free: int = 0  # no spec: not validated, not described

    def __post_init__(self) -> None:
        validate(self)


SPECS = [
    Int(),
    Int(lo=0, hi=10),
    Int(lo=0, lo_open=True),
    Size(lo=1, hi=100),
    Float(),
    Float(lo=0, lo_open=True),
    Float(lo=0, hi=1, hi_open=True),
    Float(allow_inf=True),
    Float(lo=0, allow_inf=True),
    Bool(),
    Choice("none", "aqe"),
    Str(),
    Str(min_len=1, max_len=3),
    PathSetting(),
    Optional(Int(lo=0)),
    Optional(Float(lo=0)),
    Optional(Choice("a")),
    FloatTuple(),
    FloatTuple(Float(lo=0), min_len=2, max_len=2),
]
HOSTILE_TEXT = [
    "NaN",
    "nan",
    "inf",
    "-inf",
    "-1",
    "0",
    "1e30",
    "abc",
    "true",
    "",
    "1_0",
    "1.5",
    " 2 ",
    "null",
    "[1, 2]",
    "0x10",
    "1e999",
    "\x00",
    "9" * 400,
    "１",
]
HOSTILE_VALUES = [
    math.nan,
    math.inf,
    -math.inf,
    -1,
    0,
    1e30,
    "abc",
    "true",
    "",
    True,
    None,
    1.5,
    10**400,
    np.float32("nan"),
    np.int64(3),
    [1.0, 2.0],
    (0.5,),
    {"a": 1},
    object(),
]


def _one_line_or_value(call):
    try:
        return call()
    except InputError as exc:
        msg = str(exc)
        assert "\n" not in msg and msg.startswith("setting s:"), msg
        return exc


@pytest.mark.parametrize("spec", SPECS, ids=repr)
@pytest.mark.parametrize("raw", HOSTILE_TEXT)
def test_every_kind_parses_hostile_text_or_refuses_in_one_line(spec, raw):
    out = _one_line_or_value(lambda: spec.parse("s", raw))
    if not isinstance(out, InputError):
        assert spec.check("s", out) == out  # what parses passes the check
        if isinstance(out, float):
            assert not math.isnan(out)


@pytest.mark.parametrize("spec", SPECS, ids=repr)
@pytest.mark.parametrize("value", HOSTILE_VALUES, ids=repr)
def test_every_kind_checks_hostile_values_or_refuses_in_one_line(spec, value):
    out = _one_line_or_value(lambda: spec.check("s", value))
    if isinstance(out, float):
        assert not math.isnan(out)


@settings(max_examples=300, deadline=None)
@given(spec=st.sampled_from(SPECS), raw=st.text(max_size=40))
def test_property_any_text_gives_a_value_or_one_line(spec, raw):
    _one_line_or_value(lambda: spec.parse("s", raw))


@settings(max_examples=300, deadline=None)
@given(
    spec=st.sampled_from(SPECS),
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(),
        st.booleans(),
        st.none(),
        st.text(max_size=8),
        st.lists(st.floats(allow_nan=True), max_size=5),
        st.tuples(st.integers()),
    ),
)
def test_property_any_value_gives_a_value_or_one_line(spec, value):
    out = _one_line_or_value(lambda: spec.check("s", value))
    if isinstance(out, float):
        assert math.isfinite(out) or (isinstance(spec, Float) and spec.allow_inf)


def test_nan_passes_no_range_and_inf_only_where_allowed():
    for spec in (Float(lo=0), Float(hi=0), Float(lo=0, lo_open=True), Float(allow_inf=True)):
        with pytest.raises(InputError, match="expected a"):
            spec.check("s", math.nan)
    with pytest.raises(InputError, match="expected a finite number"):
        Float(lo=0).parse("s", "inf")
    assert Float(lo=0, allow_inf=True).parse("s", "inf") == math.inf
    with pytest.raises(InputError, match=r"must be >= 0"):
        Float(lo=0, allow_inf=True).parse("s", "-inf")


def test_ints_are_ints():
    spec = Int(lo=1)
    assert spec.parse("k", "12") == 12
    for raw in ("1.5", "1_0", "true", "1e3", "0x10", "", "12abc"):
        with pytest.raises(InputError, match=r"^setting k: expected a whole number, got"):
            spec.parse("k", raw)
    for value in (True, 1.5, 2.0, "3"):
        with pytest.raises(InputError, match="expected a whole number"):
            spec.check("k", value)
    assert type(spec.check("k", np.int64(3))) is int
    with pytest.raises(InputError, match=r"setting k: must be >= 1, got 0"):
        spec.parse("k", "0")


def test_message_names_the_setting_and_the_value():
    with pytest.raises(InputError) as info:
        parse(Toy, "qe_alpha", "abc")
    assert str(info.value) == "setting qe_alpha: expected a finite number, got 'abc'"
    with pytest.raises(InputError) as info:
        Float(lo=0).parse("--lr", "nan", what="option")
    assert str(info.value) == "option --lr: expected a finite number, got 'nan'"
    with pytest.raises(InputError, match=r"setting ratio: must be in \(0, 1\], got 0"):
        Toy(ratio=0)


def test_bools_choices_strings_paths_optionals_tuples():
    assert [Bool().parse("b", t) for t in ("true", "FALSE", "1", "0", "yes", "No")] == [
        True,
        False,
        True,
        False,
        True,
        False,
    ]
    with pytest.raises(InputError, match="expected true or false"):
        Bool().check("b", 1)
    assert Choice("none", "aqe").parse("q", "aqe") == "aqe"
    with pytest.raises(InputError, match="expected one of none, aqe"):
        Choice("none", "aqe").parse("q", "AQE")
    with pytest.raises(InputError, match="NUL"):
        Str().parse("s", "a\x00b")
    with pytest.raises(InputError, match="NUL"):
        Str().check("s", "a\x00b")
    with pytest.raises(InputError, match="1 to 3 characters"):
        Str(min_len=1, max_len=3).check("s", "abcd")
    assert Optional(PathSetting()).parse("w", "null") is None
    assert Optional(PathSetting()).parse("w", "a/b.pt") == "a/b.pt"
    with pytest.raises(InputError, match="expected a path"):
        PathSetting().parse("w", "")
    spec = FloatTuple(Float(lo=0.1, hi=4), max_len=3)
    assert spec.parse("s", "0.5,1") == (0.5, 1.0)
    assert spec.parse("s", "[0.5, 1, 2]") == (0.5, 1.0, 2.0)
    assert spec.parse("s", "(1,)") == (1.0,)
    for raw in ("0.5,nan", "1,2,3,4", "a,b", "", "0.01"):
        with pytest.raises(InputError):
            spec.parse("s", raw)
    assert spec.check("s", [1, 2]) == (1.0, 2.0)


def test_size_names_the_memory_bound():
    with pytest.raises(
        InputError, match=r"setting neg_num: must be in \[1, 1000\] \(a bound that keeps memory"
    ):
        parse(Toy, "neg_num", "1000000000")
    with pytest.raises(TypeError):
        Size(lo=1)


def test_validate_checks_dataclass_fields_and_normalizes():
    with pytest.raises(InputError, match="setting qe_k: expected a whole number, got 1.5"):
        Toy(qe_k=1.5)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="setting gamma: expected a number"):
        Toy(gamma=math.nan)
    with pytest.raises(InputError, match="setting max_side"):
        Inner(max_side=0)
    toy = Toy(qe_alpha=np.float32(2.0), scales=[1.0, 2.0])  # type: ignore[arg-type]
    assert type(toy.qe_alpha) is float and toy.scales == (1.0, 2.0)
    assert Toy(free=-5).free == -5


def test_parse_and_coerce_by_field_name_with_dotted_names():
    assert parse(Toy, "qe_k", "7") == 7
    assert parse(Toy, "features.max_side", "512") == 512
    assert parse(Toy(), "features.max_side", "512") == 512
    with pytest.raises(InputError, match="setting features.max_side: must be in"):
        parse(Toy, "features.max_side", "1")
    assert coerce(Toy, "qe_alpha", 2) == 2.0
    assert coerce(Toy, "qe_alpha", "2") == 2.0
    with pytest.raises(InputError, match="unknown setting 'nope'"):
        parse(Toy, "nope", "1")
    with pytest.raises(InputError, match="unknown setting 'features.nope'"):
        parse(Toy, "features.nope", "1")
    with pytest.raises(InputError, match="takes no value"):
        spec_of(Toy, "free")
    assert isinstance(spec_of(Toy, "features.max_side"), Int)


def test_describe_lists_every_setting_with_type_default_range_and_doc():
    rows = {r.name: r for r in describe(Toy)}
    assert list(rows)[:2] == ["qe_k", "qe_alpha"]
    assert "free" not in rows and "features" not in rows
    assert (
        rows["qe_k"].kind == "int"
        and rows["qe_k"].default == 10
        and rows["qe_k"].range == "in [1, 10000]"
    )
    assert rows["qe_k"].doc == "neighbours averaged"
    assert rows["ratio"].range == "in (0, 1]"
    assert rows["gamma"].range == "> 0, inf allowed"
    assert rows["qe"].range == "one of none, aqe, alpha-qe"
    assert rows["weights"].kind == "path or none"
    assert rows["features.max_side"].default == 1024
    assert {r.name: r.default for r in describe(Toy(qe_k=3))}["qe_k"] == 3
