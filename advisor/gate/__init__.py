"""`advisor gate` and `advisor baseline`: performance budgets and regression checks for CI.

record.py reduces a run to what a later run is judged against (the baseline file);
compare.py judges step times on the per-step samples of both runs; budgets.py reads and
checks the budgets; evaluate.py runs every check; verdict.py holds the result; outputs.py
writes it for the terminal, JSON, JUnit XML and GitHub Actions; command.py is the CLI.
"""
