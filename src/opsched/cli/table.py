"""Plain-text and Markdown tables for the CLI and benchmarks."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["format_table"]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]], markdown: bool = False) -> str:
    """``rows`` under ``headers``, each column as wide as its widest cell; a column of numbers
    (``1.5``, ``2.00x``, ``12%``, blanks aside) aligned right, any other left."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    # a column of numbers (blank cells aside) aligns right
    numeric = [any(r[i] for r in cells[1:]) and all(_is_num(r[i]) for r in cells[1:] if r[i])
               for i in range(len(headers))]

    def line(r: list[str]) -> str:
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(r, widths, numeric)]
        return ("| " + " | ".join(parts) + " |") if markdown else "  ".join(parts).rstrip()

    out = [line(cells[0])]
    if markdown:
        out.append("|" + "|".join(("-" * (w + 1) + ":") if num else ("-" * (w + 2))
                                  for w, num in zip(widths, numeric)) + "|")
    else:
        out.append("  ".join("-" * w for w in widths))
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def _is_num(s: str) -> bool:
    try:
        float(s.replace(",", "").rstrip("x%"))
    except ValueError:
        return False
    return True
