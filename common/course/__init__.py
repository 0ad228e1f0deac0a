"""The course's generators: what the READMEs show is made from code and committed results, never typed.

    python -m common.readme    readme.py   every generated block of every chapter (blocks.py renders them)
    python -m common.report    report.py   the front page's cross-stage table and chart, from the ladder runs
    python -m common.diff      diff.py     a stage's idea as a diff of code against the stage before

results.py reads committed results under the engine names the course uses today.
"""
