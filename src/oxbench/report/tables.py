"""Plain-text, markdown, LaTeX and CSV renderings of small result tables (header + string rows)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # pragma: no cover
    from oxbench.evaluation.result import EvaluationResult


def text_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], *, title: str | None = None
) -> str:
    """A terminal table with aligned columns (first column left, the others right).

    Example:
        >>> print(text_table(["setup", "mAP"], [["easy", "84.81"]]))
        setup    mAP
        -----  -----
        easy   84.81
    """
    cols = list(zip(*([list(header)] + [list(r) for r in rows]), strict=True))
    widths = [max(len(c) for c in col) for col in cols]

    def fmt(cells: Sequence[str]) -> str:
        parts = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    out = [title] if title else []
    out.append(fmt(header))
    out.append("  ".join("-" * w for w in widths))
    out.extend(fmt(r) for r in rows)
    return "\n".join(out)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-markdown table (numbers right-aligned)."""
    out = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|",
    ]
    out.extend("| " + " | ".join(r) + " |" for r in rows)
    return "\n".join(out)


_TEX_SPECIAL = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
    "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
}  # fmt: skip


def _tex(s: str) -> str:
    """``s`` as LaTeX text: every special character escaped (a run label is the user's text), and a
    leading ``[`` braced so that the ``\\`` ending the row before does not read it as an option."""
    out = "".join(_TEX_SPECIAL.get(c, c) for c in s)
    return "{[}" + out[1:] if out.startswith("[") else out


def latex_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A LaTeX ``tabular`` with booktabs rules (``\\usepackage{booktabs}``)."""
    spec = "l" + "r" * (len(header) - 1)
    out = [
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(_tex(h) for h in header) + r" \\",
        r"\midrule",
    ]
    out.extend(" & ".join(_tex(c) for c in r) + r" \\" for r in rows)
    out += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(out)


def csv_text(rows: Iterable[Mapping[str, Any]]) -> str:
    """Dict rows (e.g. :meth:`EvaluationResult.per_query_rows`) as CSV text with a header line."""
    rows = list(rows)
    buf = io.StringIO()
    if rows:
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return buf.getvalue()


def result_table(
    result: EvaluationResult, style: Literal["text", "markdown", "latex"] = "text"
) -> str:
    """An evaluation result's table (:meth:`~oxbench.evaluation.result.EvaluationResult.table_rows`:
    one row per setup, queries used, mAP and mP@K in percent) as a titled terminal table, GitHub
    markdown or a LaTeX ``tabular``."""
    header, rows = result.table_rows()
    if style == "text":
        return text_table(header, rows, title=result.title)
    if style == "markdown":
        return markdown_table(header, rows)
    if style == "latex":
        return latex_table(header, rows)
    raise ValueError(f"style must be text, markdown or latex, got {style!r}")
