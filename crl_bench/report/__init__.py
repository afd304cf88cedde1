"""Tables and plots from run directories (``crl-bench report``), and whole-suite reproduction
(``crl-bench reproduce``).

- :mod:`~crl_bench.report.runs`: read run directories; account for missing/unfinished runs.
- :mod:`~crl_bench.report.stats`: mean ± Student-t CI over seeds; Welch CI for gains.
- :mod:`~crl_bench.report.tables`: the paper's tables; :mod:`~crl_bench.report.paper`: its numbers.
- :mod:`~crl_bench.report.plots`: PNG curves with CI bands.
- :mod:`~crl_bench.report.writer`: ``write_report`` (Markdown, CSV, JSON, PNG).
- :mod:`~crl_bench.report.suites` / :mod:`~crl_bench.report.cli`: suite matrices and the CLI.

Nothing heavy is imported here; scipy and matplotlib load when a report is written.
"""
