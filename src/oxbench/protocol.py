"""Scoring protocols as objects: the mechanism (the :class:`Protocol` base and its registry).

A protocol (revisited Oxford/Paris, the original one, Holidays, UKBench, GLDv2 retrieval, ILIAS)
is one object that knows everything protocol-specific: its setups, the label vocabulary a run
record writes, how it scores a ranking, the familiar printed line, the compact headline
``oxbench runs`` prints, the JSON it writes and how that JSON is read back. Everything else
(ground truth, results, run records, reports, the command line) asks the object; no module
outside the protocols compares protocol names. This module holds only the machinery, as
:mod:`oxbench.registry` does for the other kinds: the built-in protocols are one module each in
:mod:`oxbench.evaluation.protocols`, imported on the first lookup, and a package of one's own adds
one through the ``oxbench.protocols`` entry-point group (or by importing a module that calls
:func:`register_protocol`).

A protocol object *is* its name (a :class:`str`): ``gt.protocol == "revisited"`` holds, JSON writes
the name, and a record read back resolves the name to the object with :func:`get_protocol`.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from oxbench.errors import InputError
from oxbench.registry import GROUPS, Registry

#: The package whose every module declares one built-in protocol; imported on first lookup.
PROTOCOLS_PACKAGE = "oxbench.evaluation.protocols"


@dataclass(frozen=True)
class Headline:
    """What a protocol's compact headline shows (``mAP E 84.81 M 64.67 H 38.47``).

    Attributes:
        label: the metric's name as printed (``mAP``, ``score``, ``mAP@100``).
        metric: the per-query column whose mean it is (``ap``, ``score``).
        scale: the factor applied before printing (100 for percent).
        decimals: digits after the point.
    """

    label: str
    metric: str
    scale: float = 100.0
    decimals: int = 2


#: A formatter of one number of the headline: ``(setup, headline) -> text``.
NumberText = Callable[[str, Headline], str]


class Protocol(str):
    """A scoring protocol: the object is its name and answers everything protocol-specific.

    Subclasses declare the class attributes and implement :meth:`evaluate`, :meth:`lines`,
    :meth:`result_dict` and :meth:`stored_means`; one instance per protocol is registered with
    :func:`register_protocol`. Results and ground truth are typed in the implementations
    (:class:`oxbench.evaluation.result.EvaluationResult`, :class:`oxbench.groundtruth.GroundTruth`).
    """

    #: The setups, in their order (``easy``, ``medium``, ``hard``; one for most protocols).
    setups: ClassVar[tuple[str, ...]] = ()
    #: Per setup its name in the headline (``E``, ``M``, ``H``); a protocol of one setup needs none.
    letters: ClassVar[Mapping[str, str]] = {}
    #: The label vocabulary of a run's ``retrieved.json``.
    labels: ClassVar[tuple[str, ...]] = ()
    #: Per setup: (positive labels, ignored labels) in :attr:`labels`' vocabulary.
    setup_labels: ClassVar[Mapping[str, tuple[frozenset[str], frozenset[str]]]] = {}
    #: The K of the P@K columns reported when none are asked for.
    default_ks: ClassVar[tuple[int, ...]] = ()
    #: The ``oxbench evaluate`` subcommand that scores it.
    command: ClassVar[str] = ""
    #: Its name in messages (``UKBench``, ``GLDv2 retrieval``).
    full_name: ClassVar[str] = ""
    #: Whether its :attr:`command` scores descriptor files of an installed dataset
    #: (``--dataset D --db-features X --query-features Q``).
    scores_feature_files: ClassVar[bool] = False
    #: What the compact headline shows.
    headline_metric: ClassVar[Headline] = Headline("mAP", "ap")
    #: One line: what the protocol is, for ``--help`` and docs.
    about: ClassVar[str] = ""

    def __new__(cls, name: str) -> Protocol:
        return super().__new__(cls, name)

    def __reduce__(self) -> tuple[Any, ...]:
        return (get_protocol, (str(self),))

    def __repr__(self) -> str:
        return f"<protocol {str(self)}>"

    # -- scoring ------------------------------------------------------------------------------
    def evaluate(
        self,
        gt: Any,
        ranks: Any,
        *,
        ks: Any = None,
        n_distractors: int = 0,
        padding: int | None = None,
        gaps: bool = False,
        source: str = "ranks",
        scores: Any = None,
    ) -> Any:
        """Score ranked lists ``[n_queries, k]`` of ``gt`` (an ``EvaluationResult``); the
        arguments are those of :func:`oxbench.evaluation.evaluate`."""
        raise NotImplementedError

    def evaluate_scores(self, gt: Any, scores: Any, **options: Any) -> Any:
        """Score a similarity matrix ``[n_db (+ distractors), n_queries]``."""
        raise InputError(f"the {self} protocol does not score a similarity matrix")

    def query_label_parts(self, query: Any) -> tuple[tuple[Any, int], ...]:
        """Per query its labelled database indices and their kernel codes
        (:mod:`oxbench.evaluation.kernels`), for the protocols scored by label."""
        raise NotImplementedError

    # -- writing ------------------------------------------------------------------------------
    def lines(self, result: Any) -> list[str]:
        """The familiar printed line(s) of a result (``roxford5k: mAP E: 84.81, ...``)."""
        raise NotImplementedError

    def table(self, result: Any) -> tuple[list[str], list[list[str]]]:
        """Header and rows of the result's table (one row per setup)."""
        raise NotImplementedError

    def result_dict(self, result: Any) -> dict[str, Any]:
        """The JSON object of a result (``metrics.json``, ``oxbench evaluate --json``)."""
        raise NotImplementedError

    def headline(self, number: NumberText) -> str:
        """The one compact headline: ``mAP E 84.81 M 64.67 H 38.47``, ``mAP 80.10``,
        ``score 3.5000``, ``mAP@100 public 12.30 private 11.90``.

        Args:
            number: the text of one setup's number (a run's mean, a seed group's spread).
        """
        h = self.headline_metric
        if len(self.setups) == 1:
            return f"{h.label} {number(self.setups[0], h)}"
        return f"{h.label} " + " ".join(
            f"{self.letters.get(s, s)} {number(s, h)}" for s in self.setups
        )

    # -- reading back -------------------------------------------------------------------------
    def stored_means(
        self, metrics: Mapping[str, Any], per_query: Mapping[str, Mapping[str, Any]]
    ) -> Iterator[tuple[str, Any, str, str]]:
        """The means a ``metrics.json`` holds, to check against the per-query rows (``per_query``:
        setup -> column -> values): per mean ``(what, stored value, setup, per-query column)``.

        Raises:
            InputError: ``metrics`` is not shaped as :meth:`result_dict` writes it.
        """
        raise NotImplementedError


def number_text(mean: Callable[[str, str], float]) -> NumberText:
    """A headline formatter from a mean per (setup, column): ``84.81``, ``nan`` for no value."""

    def text(setup: str, h: Headline) -> str:
        v = mean(setup, h.metric)
        return "nan" if math.isnan(v) else f"{h.scale * v:.{h.decimals}f}"

    return text


def _load_builtin() -> None:
    package = importlib.import_module(PROTOCOLS_PACKAGE)
    for info in pkgutil.iter_modules(package.__path__, PROTOCOLS_PACKAGE + "."):
        if not info.name.rsplit(".", 1)[-1].startswith("_"):
            importlib.import_module(info.name)


def _adopt(name: str, obj: object) -> None:
    """An ``oxbench.protocols`` entry point that names a protocol object."""
    if not isinstance(obj, Protocol):
        raise TypeError(f"entry point {name!r} names {obj!r}, not a module or a Protocol")
    register_protocol(obj)


#: Every protocol by name; plugins add theirs through the ``oxbench.protocols`` entry points.
PROTOCOLS: Registry[Protocol] = Registry(
    "protocol", loader=_load_builtin, group=GROUPS["protocols"], adopt=_adopt
)


def register_protocol(protocol: Protocol) -> Protocol:
    """Register a protocol object under its name; returns it."""
    if not isinstance(protocol, Protocol) or not str(protocol):
        raise TypeError(f"{protocol!r} is not a named Protocol")
    return PROTOCOLS.register(str(protocol), protocol)


def get_protocol(name: str) -> Protocol:
    """The protocol object named ``name`` (a protocol object is returned as it is).

    Raises:
        InputError: no protocol has that name (the message lists the known ones).
    """
    if isinstance(name, Protocol):
        return name
    if not isinstance(name, str):
        raise InputError(f"a protocol is named by text, got {name!r}")
    return PROTOCOLS.get(name)
