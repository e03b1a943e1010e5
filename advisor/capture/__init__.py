"""`advisor profile`: run an unmodified training script under torch.profiler.

One direction of flow:

    (the CLI function `profile` is advisor/cli/profile.py: checks input, makes the log dir, reports)
      launch.py  --nproc-per-node: torchrun, each rank running the same capture
    session.py   one capture: profiler + step window + stop on purpose + facts file
      hooks.py   finds step ends, records facts; wraps torch, undoes it on exit
      runner.py  runs the script/module as __main__ (the way `python` would)
      facts.py   the facts file (advisor_facts.json)
      progress.py what is said on stderr while it runs

Only this package imports torch, and only when a capture runs: importing
`advisor.cli.profile` does not load torch, so `advisor report` never does.
"""
