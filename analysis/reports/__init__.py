"""What `orch report` and the other commands show: the sweep report (`report`), the paper's side-by-side
(`paper_report`), the answers to the paper's questions (`answers`), tables, figures, the report's sections
(`sections`), the filter and predictor views (`filter_report`, `predictor_view`)."""
