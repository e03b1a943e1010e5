"""Find the training steps of an unmodified script, and record how it trains.

Every hook here wraps what torch already has and calls it unchanged; nothing is replaced.
`Hooks.install()` puts the wrappers in, `Hooks.uninstall()` puts the originals back (a
wrapper someone else has since wrapped again is left in place but becomes a plain
pass-through, so their wrapper keeps working).

Where a step ends:

* **optimizer** (preferred): right after the outermost `optimizer.step()` returns (or
  `GradScaler.step(optimizer)`, which may skip the optimizer's step on overflow). Each
  optimizer class's `step` is wrapped when torch patches it for profiling
  (`Optimizer._patch_step_function`, called by every `Optimizer.__init__`), so the step ends
  *outside* torch's `Optimizer.step#...` range and the trace keeps ranges nested. The global
  `register_optimizer_step_post_hook` catches optimizers created some other way. With
  several optimizers (a GAN), the one that steps last in a round ends the step, once the
  first round has shown the order.
* **dataloader** (fallback, for scripts without an optimizer): when the script asks its
  DataLoader for the next batch after having had one, i.e. when it is done with the batch.
  Only the first DataLoader to do so counts. An optimizer step seen later takes over.
* **forward** (fallback, for inference and evaluation loops with no optimizer and no
  DataLoader): when the model is called again from the line of the script that called it
  before (the same call in the same line), i.e. at the start of the loop's next iteration. Global module hooks find the first
  outermost module call made twice from the same line (not inside a DataLoader fetch); they
  are then removed, and a hook on that one module counts the steps. No step is counted this
  way once a backward pass, an optimizer step or a DataLoader batch has been seen (that is a
  training loop, or a loop the other sources describe better).

What is recorded (see facts.py): DataLoaders iterated, autocast entered, GradScaler used,
torch.compile calls, DataParallel / DistributedDataParallel built, optimizers stepped,
zero_grad(set_to_none=...), how long each step waited for its DataLoader's next batch
(also outside the profiled window, where prefetched batches can no longer hide a slow input
pipeline) and how long it spent in its optimizer's step (outside the window, that step's cost
without the profiler, measured rather than assumed to shrink with the rest of the step). Profilers started by the script itself are reported to the session, which then
stands aside.
"""

from __future__ import annotations

import functools
import os
import sys
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import Optimizer, register_optimizer_step_post_hook
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from advisor.capture.facts import FactsRecorder

try:  # keep dynamo out of our step bookkeeping when a script compiles a function that steps;
    # lazy: torch._dynamo is imported on first use (Optimizer() imports it anyway)
    _no_dynamo = torch._disable_dynamo
except AttributeError:  # pragma: no cover - older torch
    def _no_dynamo(fn):
        return fn


# True while Dynamo traces: the global module hooks then return at once. Dynamo reads this call
# as a constant and inlines the hook to nothing; a hook it may not trace (`torch._disable_dynamo`)
# would instead break the graph at every submodule call, and the run recorded would not be the
# compiled model the script asked for.
_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_ADVISOR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# torch warns that global module hooks fire once more for a torch.compile wrapper: ours expect it.
_COMPILE_HOOK_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"


def _call_site() -> tuple[Any, int] | None:
    """Where the script made the current module call: the first frame outside torch and
    advisor, as (code, instruction offset), so two calls on one line are two sites."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith((_TORCH_DIR, _ADVISOR_DIR)):
        f = f.f_back
    return (f.f_code, f.f_lasti) if f is not None else None


class Patches:
    """Wrap attributes of classes/modules and undo it exactly."""

    def __init__(self) -> None:
        self.active = True
        self._done: list[tuple[Any, str, bool, Any, Any]] = []  # owner, name, had_own, original, wrapper
        self._wrapped: set[tuple[int, str]] = set()

    def wrap(self, owner: Any, name: str, make: Callable[[Any], Callable]) -> None:
        key = (id(owner), name)
        if key in self._wrapped:
            return
        had_own = name in vars(owner)
        original = vars(owner)[name] if had_own else getattr(owner, name)
        wrapper = make(original)
        try:
            functools.update_wrapper(wrapper, original)
        except (AttributeError, TypeError):  # pragma: no cover - builtins without metadata
            pass
        wrapper.__advisor_wrapper__ = True  # type: ignore[attr-defined]
        setattr(owner, name, wrapper)
        self._done.append((owner, name, had_own, original, wrapper))
        self._wrapped.add(key)

    def is_wrapped(self, owner: Any, name: str) -> bool:
        return (id(owner), name) in self._wrapped

    def undo(self) -> None:
        self.active = False
        for owner, name, had_own, original, wrapper in reversed(self._done):
            if vars(owner).get(name) is not wrapper:
                continue  # wrapped again by someone else: ours stays, inert
            if had_own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
        self._done.clear()
        self._wrapped.clear()


def _autocast_dtype(ctx: Any) -> str | None:
    dtype = getattr(ctx, "fast_dtype", None)
    return str(dtype).replace("torch.", "") if dtype is not None else None


class Hooks:
    """Step detection and facts recording for one run.

    on_step() is called at every step end (it may raise to stop the run);
    on_profiler_start(prof) when any profiler starts (the session knows which one is its own);
    on_trace_export(prof, path) when any profiler writes a trace.
    """

    def __init__(
        self,
        facts: FactsRecorder,
        on_step: Callable[[], None],
        on_profiler_start: Callable[[Any], None] | None = None,
        on_trace_export: Callable[[Any, str], None] | None = None,
    ) -> None:
        self.facts = facts
        self.on_step = on_step
        self.on_profiler_start = on_profiler_start or (lambda prof: None)
        self.on_trace_export = on_trace_export or (lambda prof, path: None)
        self.source: str | None = None  # "optimizer" | "dataloader"
        self.switched_source = False
        self.switched_from: str | None = None  # the source used before the switch
        self.steps = 0
        self._patches = Patches()
        self._post_handle = None
        self._depth = 0  # inside wrapped optimizer/GradScaler steps
        self._first_round: list[int] = []
        self._driver: int | None = None
        self._iter_loader: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._driver_loader: int | None = None
        self._exporting = 0
        self._loader_wait_ns = 0
        self._optimizer_ns = 0  # inside the outermost wrapped Optimizer.step since the last step end
        self._optimizer_depth = 0
        self.backward_seen = False
        self._in_fetch = 0  # inside DataLoader.__next__ (transforms may call modules)
        self._module_depth = 0
        self._module_calls: dict[tuple[int, Any], int] = {}
        self._module_hooks: list[Any] = []
        self._driver_module_hook = None
        self._driver_site: tuple[Any, int] | None = None
        self._pid = os.getpid()

    # -- install / uninstall ----------------------------------------------------------------
    def install(self) -> None:
        self._install_optimizer()
        self._install_loader()
        self._install_switches()
        self._install_model_calls()
        self._install_profiler()

    def _install_optimizer(self) -> None:
        """Optimizer steps (the step boundary) and the GradScaler."""
        p = self._patches
        hooks = self

        def patch_step_function(original):
            def _patch_step_function(opt, *args, **kwargs):
                result = original(opt, *args, **kwargs)
                if p.active:
                    hooks._wrap_optimizer_class(type(opt))
                return result

            return _patch_step_function

        p.wrap(Optimizer, "_patch_step_function", patch_step_function)
        self._post_handle = register_optimizer_step_post_hook(self._post_hook)

        scaler_cls = torch.amp.GradScaler
        p.wrap(scaler_cls, "step", self._stepping_wrapper)

        def scale(original):
            def scale(scaler, *args, **kwargs):
                if p.active:
                    hooks._scaler_used(scaler)
                return original(scaler, *args, **kwargs)

            return scale

        p.wrap(scaler_cls, "scale", scale)

    def _install_loader(self) -> None:
        """DataLoader iteration: each batch's wait (inside the window and out)."""
        p = self._patches
        hooks = self

        def loader_iter(original):
            def __iter__(loader, *args, **kwargs):
                it = original(loader, *args, **kwargs)
                if p.active:
                    hooks._loader_iterated(loader, it)
                return it

            return __iter__

        p.wrap(DataLoader, "__iter__", loader_iter)

        def batch_next(original):
            def __next__(it, *args, **kwargs):
                if not p.active:
                    return original(it, *args, **kwargs)
                if hooks.source != "optimizer" and getattr(it, "_num_yielded", 1) > 0:
                    hooks._batch_requested(it)
                started = time.perf_counter_ns()
                hooks._in_fetch += 1
                try:
                    return original(it, *args, **kwargs)
                finally:
                    hooks._in_fetch -= 1
                    hooks._loader_wait_ns += time.perf_counter_ns() - started

            return __next__

        p.wrap(_BaseDataLoaderIter, "__next__", batch_next)

    def _install_switches(self) -> None:
        """What the script turns on: autocast, torch.compile, DataParallel/DDP, zero_grad, backward."""
        p = self._patches
        hooks = self

        def autocast_enter(original):
            def __enter__(ctx, *args, **kwargs):
                result = original(ctx, *args, **kwargs)
                if p.active and getattr(ctx, "_enabled", False):
                    hooks._autocast_entered(ctx)
                return result

            return __enter__

        p.wrap(torch.amp.autocast_mode.autocast, "__enter__", autocast_enter)

        def compile_(original):
            def compile(*args, **kwargs):
                if p.active:
                    hooks._compiled(kwargs.get("mode"), kwargs.get("backend"))
                compiled = original(*args, **kwargs)
                if p.active:
                    hooks._watch_compiled(compiled)
                return compiled

            return compile

        p.wrap(torch, "compile", compile_)

        def parallel_init(kind):
            def make(original):
                def __init__(module, *args, **kwargs):
                    original(module, *args, **kwargs)
                    if p.active:
                        hooks._parallel_built(kind)

                return __init__

            return make

        p.wrap(torch.nn.DataParallel, "__init__", parallel_init("data_parallel"))
        p.wrap(torch.nn.parallel.DistributedDataParallel, "__init__", parallel_init("ddp"))

        def zero_grad(original):
            def zero_grad(obj, *args, **kwargs):
                if p.active:
                    hooks._zero_grad(args[0] if args else kwargs.get("set_to_none", True))
                return original(obj, *args, **kwargs)

            return zero_grad

        p.wrap(Optimizer, "zero_grad", zero_grad)
        p.wrap(torch.nn.Module, "zero_grad", zero_grad)

        def backward(original):
            def backward(*args, **kwargs):
                if p.active and not hooks.backward_seen:
                    hooks._backward_seen()
                return original(*args, **kwargs)

            return backward

        p.wrap(torch.autograd, "backward", backward)
        p.wrap(torch.autograd, "grad", backward)

    def _install_model_calls(self) -> None:
        """Model calls, for loops with neither an optimizer nor a DataLoader (see the module doc)."""
        self._pid = os.getpid()
        warnings.filterwarnings("ignore", message=_COMPILE_HOOK_WARNING)
        self._module_hooks = [
            register_module_forward_pre_hook(self._module_pre_hook),
            register_module_forward_hook(self._module_post_hook, always_call=True),
        ]

    def _install_profiler(self) -> None:
        """The script's own profiler: notice it starting, and the traces it writes."""
        p = self._patches
        hooks = self
        import torch.autograd.profiler as autograd_profiler
        from torch.profiler import profiler as tp

        def started(original):
            def start(prof, *args, **kwargs):
                if p.active:
                    hooks.on_profiler_start(prof)
                return original(prof, *args, **kwargs)

            return start

        def exported(original):
            def export_chrome_trace(prof, path, *args, **kwargs):
                hooks._exporting += 1  # torch.profiler's export calls the autograd profiler's
                try:
                    result = original(prof, path, *args, **kwargs)
                finally:
                    hooks._exporting -= 1
                if p.active and hooks._exporting == 0:
                    hooks.on_trace_export(prof, str(path))
                return result

            return export_chrome_trace

        p.wrap(tp.profile, "start", started)
        p.wrap(tp._KinetoProfile, "start", started)
        p.wrap(autograd_profiler.profile, "__enter__", started)
        p.wrap(tp._KinetoProfile, "export_chrome_trace", exported)
        p.wrap(autograd_profiler.profile, "export_chrome_trace", exported)

    def uninstall(self) -> None:
        if self._post_handle is not None:
            self._post_handle.remove()
            self._post_handle = None
        self._drop_module_hooks()
        if self._driver_module_hook is not None:
            self._driver_module_hook.remove()
            self._driver_module_hook = None
        warnings.filters[:] = [f for f in warnings.filters if not (f[1] is not None and f[1].pattern == _COMPILE_HOOK_WARNING)]
        self._patches.undo()

    @property
    def mode(self) -> str | None:
        """"training" once a backward pass or an optimizer step ran, "inference" if steps were
        found without either, None when no step was found."""
        if self.backward_seen or self.facts.optimizers:
            return "training"
        return "inference" if self.steps else None

    # -- optimizer steps --------------------------------------------------------------------
    def _wrap_optimizer_class(self, cls: type) -> None:
        if not self._patches.is_wrapped(cls, "step") and not getattr(cls.step, "__advisor_wrapper__", False):
            self._patches.wrap(cls, "step", self._stepping_wrapper)

    def _stepping_wrapper(self, original):
        """Wrap a step(self_or_scaler, optimizer?, ...) so its outermost return ends a step."""
        p = self._patches
        hooks = self

        def step(obj, *args, **kwargs):
            if not p.active:
                return original(obj, *args, **kwargs)
            update = int(isinstance(obj, Optimizer))  # not a GradScaler's step around it
            timed = update and hooks._optimizer_depth == 0
            hooks._enter_step()
            hooks._optimizer_depth += update
            started = time.perf_counter_ns()
            try:
                result = original(obj, *args, **kwargs)
            except BaseException:
                hooks._optimizer_depth -= update
                hooks._leave_step(None)
                raise
            hooks._optimizer_depth -= update
            if timed:  # before the step ends, so that the step that just ran holds its own update
                hooks._optimizer_ns += time.perf_counter_ns() - started
            hooks._leave_step(obj if update else (args[0] if args else kwargs.get("optimizer")))
            return result

        return step

    @_no_dynamo
    def _enter_step(self) -> None:
        self._depth += 1

    @_no_dynamo
    def _leave_step(self, opt: Any) -> None:
        self._depth -= 1
        if self._depth == 0 and opt is not None:
            self._optimizer_stepped(opt)

    @_no_dynamo
    def _post_hook(self, opt: Any, args: Any, kwargs: Any) -> None:
        if self._patches.active and self._depth == 0:  # an optimizer class we did not wrap
            self._optimizer_stepped(opt)

    def _optimizer_stepped(self, opt: Any) -> None:
        self.facts.saw_optimizer(opt)
        self._drop_module_hooks()
        if self.source != "optimizer":
            self.switched_source = self.source in ("dataloader", "forward")
            self.switched_from = self.source if self.switched_source else None
            self.source = "optimizer"
        key = id(opt)
        if self._driver is None:
            if key in self._first_round:
                self._driver = self._first_round[-1]
                if key != self._driver:
                    return
            else:
                self._first_round.append(key)
        elif key != self._driver:
            return
        self._step()

    # -- DataLoader batches -----------------------------------------------------------------
    def _loader_iterated(self, loader: Any, it: Any) -> None:
        self.facts.saw_dataloader(loader, self.steps)
        try:
            self._iter_loader[it] = id(loader)
        except TypeError:  # pragma: no cover - iterator without weakref support
            pass

    def _batch_requested(self, it: Any) -> None:
        loader = self._iter_loader.get(it, id(getattr(it, "_dataset", it)))
        if self._driver_loader is None:
            self._driver_loader = loader
        elif loader != self._driver_loader:
            return
        self._drop_module_hooks()
        if self.source == "forward":
            self.switched_source, self.switched_from = True, "forward"
        self.source = "dataloader"
        self._step()

    def take_loader_wait_ms(self) -> float:
        """DataLoader waiting since the last call (the step that just ended)."""
        waited, self._loader_wait_ns = self._loader_wait_ns, 0
        return waited / 1e6

    def take_optimizer_ms(self) -> float:
        """Time inside optimizer steps since the last call (the step that just ended): an
        optimizer class wrapped here, outermost (a GradScaler's step around it not counted)."""
        spent, self._optimizer_ns = self._optimizer_ns, 0
        return spent / 1e6

    # -- model calls ------------------------------------------------------------------------
    def _forward_counts(self) -> bool:
        # Not in a forked DataLoader worker: its transforms may call modules, and it has a copy of these hooks.
        return (
            self._patches.active and self.source in (None, "forward") and not self.backward_seen
            and not self._in_fetch and os.getpid() == self._pid
        )

    def _module_pre_hook(self, module: Any, args: Any) -> None:
        if _compiling():  # a submodule inside a compiled model: not the loop's call
            return
        depth = self._module_depth
        self._module_depth += 1
        if depth or not self._forward_counts():
            return
        site = _call_site()
        key = (id(module), site)
        calls = self._module_calls[key] = self._module_calls.get(key, 0) + 1
        if calls < 2:
            return
        # Called again from the same line: this is the loop's model call. Count on it alone.
        self._drop_module_hooks()
        self._driver_site = site
        self._driver_module_hook = module.register_forward_pre_hook(self._driver_pre_hook)
        self._forward_step()

    def _module_post_hook(self, module: Any, args: Any, output: Any) -> None:
        if _compiling():
            return
        self._module_depth = max(self._module_depth - 1, 0)

    @_no_dynamo
    def _driver_pre_hook(self, module: Any, args: Any) -> None:
        if self._forward_counts() and _call_site() == self._driver_site:
            self._forward_step()

    def _forward_step(self) -> None:
        self.source = "forward"
        self._step()

    def _drop_module_hooks(self) -> None:
        for handle in self._module_hooks:
            handle.remove()
        self._module_hooks = []

    def _backward_seen(self) -> None:
        self.backward_seen = True
        self._drop_module_hooks()

    def _step(self) -> None:
        self.steps += 1
        self.on_step()

    # -- facts ------------------------------------------------------------------------------
    def _scaler_used(self, scaler: Any) -> None:
        try:
            if scaler.is_enabled():
                self.facts.grad_scaler = True
        except Exception:  # pragma: no cover
            pass

    def _autocast_entered(self, ctx: Any) -> None:
        self.facts.saw_autocast(_autocast_dtype(ctx), getattr(ctx, "device", None))

    def _compiled(self, mode: Any, backend: Any) -> None:
        self.facts.saw_compile(mode, backend)

    def _watch_compiled(self, compiled: Any) -> None:
        """Move the search for the loop's model call off the global module hooks before the
        compiled code first runs. Dynamo guards on the number of global hooks, so hooks still
        there when it compiles and dropped later (at the first backward pass) would recompile
        the model once more; a compiled module's own hooks run outside its graph."""
        if not self._module_hooks:
            return
        self._drop_module_hooks()
        if isinstance(compiled, torch.nn.Module) and self._forward_counts():
            self._module_hooks = [
                compiled.register_forward_pre_hook(self._module_pre_hook),
                compiled.register_forward_hook(self._module_post_hook, always_call=True),
            ]

    def _parallel_built(self, kind: str) -> None:
        self.facts.parallel[kind] = True

    def _zero_grad(self, set_to_none: Any) -> None:
        self.facts.zero_grad_set_to_none = bool(set_to_none)
