"""A titled part of a report (`orch report`): HTML blocks (tables, notes) and plotly figures, in order. Shared by
`analysis.reports.report` and `analysis.reports.paper_report`."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go


@dataclass
class Section:
    """A titled part of the report: HTML blocks (tables, notes) and figures, in order."""

    title: str
    blocks: list[str | go.Figure] = field(default_factory=list)

    def table(self, frame: pd.DataFrame, caption: str = "", digits: int = 2, index: bool = False) -> None:
        self.blocks.append(html_table(frame, caption, digits, index))

    def note(self, text: str) -> None:
        self.blocks.append(f'<p class="note">{html.escape(text)}</p>')

    def figure(self, figure: go.Figure) -> None:
        self.blocks.append(figure)


def html_table(frame: pd.DataFrame, caption: str = "", digits: int = 2, index: bool = False) -> str:
    """A frame as an HTML table (floats to ``digits`` places, missing values as an en dash)."""
    table = frame.to_html(
        index=index, na_rep="–", float_format=lambda v: f"{v:.{digits}f}", border=0, classes="data", escape=True
    )
    head = f"<h4>{html.escape(caption)}</h4>" if caption else ""
    return f'{head}<div class="scroll">{table}</div>'
