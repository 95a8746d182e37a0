"""What people read: tables, run records and what is made from them.

- :mod:`.tables` -- text, markdown, LaTeX and CSV renderings of small tables;
- :mod:`.runs` -- :class:`~oxbench.report.runs.RunRecord`, the one reader of run records;
- :mod:`.stats` -- paired bootstrap CI, sign-flip randomization test, Holm adjustment;
- :mod:`.compare` -- ``oxbench compare``; :mod:`.paper` -- ``oxbench report`` (the paper table);
- :mod:`.plots` -- ``oxbench plot`` (matplotlib, extra ``plots``); :mod:`.viewer` -- ``oxbench view``;
- :mod:`.export` -- Oxford ranked lists, revisitop ranks, hloc pairs.
"""
