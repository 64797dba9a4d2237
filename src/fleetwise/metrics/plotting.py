"""What every fleetwise plot does before it is saved."""

from __future__ import annotations


def literal_text(fig) -> None:
    """Every text of ``fig`` that holds a ``$`` is drawn as it is written, never as TeX: a name is a name (an
    experiment called ``p99 $\\x$`` failed the report, ``$5 to $10`` lost its signs). Tick labels are set when the
    figure is drawn and keep matplotlib's math (its log-axis labels are ``$\\mathdefault{10^{1}}$``)."""
    from matplotlib.text import Text

    for t in fig.findobj(Text):
        if "$" in t.get_text():
            t.set_parse_math(False)
