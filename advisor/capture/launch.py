"""`advisor profile --nproc-per-node N`: several processes through torchrun.

The parent (the `advisor profile` process) calls `torch.distributed.run` (torchrun) in
standalone mode, which starts N copies of `python -m advisor.capture.launch ...`; each copy
is one rank: it runs the same capture as a single process would (session.capture), with the
worker name `rank<R>` and the facts file `advisor_facts.rank<R>.json`, all into the log dir
the parent created. Rank 0 shows the progress and the summary. The parent then reports.

Exit code: 0 when every rank ended well (stopped on purpose or finished), else the exit code
of the first rank that failed (each rank prints its own traceback).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from advisor.capture.runner import Target
from advisor.capture.session import CaptureOptions


def rank_argv(target: Target, o: CaptureOptions) -> list[str]:
    """The command line of one rank (after `python -m advisor.capture.launch`)."""
    argv = [
        "--out", str(o.out_dir),
        "--wait", str(o.wait), "--warmup", str(o.warmup), "--active", str(o.active), "--repeat", str(o.repeat),
        "--device", o.device,
    ]
    argv += ["--after-steps", str(o.after_steps)] * (o.after_steps is not None)
    argv += ["--full"] * o.full + {True: ["--stack"], False: ["--no-stack"], None: []}[o.with_stack]
    argv += ["--no-shapes"] * (not o.record_shapes) + ["--no-memory"] * (not o.profile_memory)
    if target.kind == "module":
        argv += ["--target-module", target.name, "--", *target.args]
    else:
        argv += ["--", target.name, *target.args]
    return argv


def launch(target: Target, options: CaptureOptions, nproc: int) -> int:
    """Run TARGET on NPROC local ranks through torchrun; return the exit code to give."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(
        ["--standalone", f"--nproc-per-node={nproc}", "-m", "advisor.capture.launch", *rank_argv(target, options)]
    )
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        run(args)
        return 0
    except ChildFailedError as exc:
        _, failure = exc.get_first_failure()
        code = failure.exitcode
        return 128 - code if code < 0 else (code or 1)
    except SignalException as exc:  # Ctrl-C / SIGTERM: torchrun passed it on to the ranks, which kept their traces
        return 128 + int(exc.sigval)
    finally:
        for s, handler in saved.items():
            if handler is not None:
                signal.signal(s, handler)


def main(argv: list[str] | None = None) -> None:
    """One rank (started by torchrun)."""
    p = argparse.ArgumentParser(prog="python -m advisor.capture.launch")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--wait", type=int, default=1)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--active", type=int, default=5)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--full", action="store_true")
    p.add_argument("--after-steps", type=int, default=CaptureOptions.after_steps)
    p.add_argument("--stack", dest="with_stack", action="store_true", default=None)
    p.add_argument("--no-stack", dest="with_stack", action="store_false")
    p.add_argument("--no-shapes", action="store_true")
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--target-module")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    ns = p.parse_args(argv)
    rest = ns.rest[1:] if ns.rest[:1] == ["--"] else ns.rest
    if ns.target_module:
        target = Target("module", ns.target_module, rest)
    else:
        target = Target("script", rest[0], rest[1:])
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    options = CaptureOptions(
        out_dir=ns.out,
        wait=ns.wait,
        warmup=ns.warmup,
        active=ns.active,
        repeat=ns.repeat,
        full=ns.full,
        after_steps=ns.after_steps,
        device=ns.device,
        record_shapes=not ns.no_shapes,
        profile_memory=not ns.no_memory,
        with_stack=ns.with_stack,
        rank=rank,
        world_size=world_size,
        progress=rank == 0,
    )
    from advisor.capture.progress import say_lines
    from advisor.capture.session import capture, summary_lines

    result = capture(target, options)
    if rank == 0 or result.exit_code:
        prefix = f"rank {rank}: " if world_size > 1 else ""
        say_lines([prefix + line for line in summary_lines(result)])
    sys.stdout.flush()
    if result.outcome.how == "terminated":  # torchrun passed on a SIGTERM: end by it, as asked
        from advisor.capture.runner import end_by_sigterm

        end_by_sigterm()
    sys.exit(result.exit_code)


if __name__ == "__main__":
    main()
