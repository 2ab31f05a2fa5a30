"""Names the forward module of a backward-pass block. Autograd runs the
backward in C++ (on its own thread), so torch's history has no Python frame
of the user for those allocations. While attribution is on, a forward hook
on every module registers a hook on the autograd node that made the
module's output; when the backward reaches that node, the time and the
module's name are kept (a bounded timeline). A frameless block allocated
during the backward is then named by the module whose backward began last
before its allocation: the module whose gradient was being computed (its
name, not a frame; the record says ``"module"``)."""

from __future__ import annotations

import bisect
import collections
import threading
import time
from typing import Any, Deque, List, Optional, Tuple

#: Backward starts kept: far more than one step's modules.
MAX_EVENTS = 65536


class ModuleTimeline:
    """Per module's backward: (start, Unix µs; qualified name)."""

    def __init__(self, max_events: int = MAX_EVENTS) -> None:
        self.events: Deque[Tuple[int, str]] = collections.deque(maxlen=max_events)
        self._names: "dict[int, str]" = {}
        self._handles: List[Any] = []
        # Modules whose forward is running, outermost first.
        self._stack: List[Any] = []
        self._lock = threading.Lock()

    def record(self, name: str, time_us: Optional[int] = None) -> None:
        self.events.append((time.time_ns() // 1000 if time_us is None else int(time_us), name))

    def module_at(self, time_us: Optional[int]) -> Optional[str]:
        """The module whose backward began last at or before ``time_us``."""
        if time_us is None or not self.events:
            return None
        with self._lock:
            events = list(self.events)
        times = [t for t, _ in events]
        i = bisect.bisect_right(times, int(time_us))
        if not i:
            return None
        # Several starts in one microsecond (a module and those around it
        # sharing an output node): the first recorded, the innermost.
        j = i - 1
        while j > 0 and times[j - 1] == times[j]:
            j -= 1
        return events[j][1]

    # --- the hooks (a live torch) ----------------------------------------------

    def install(self, torch: Any) -> None:
        """Hooks every module's forward (torch's global forward hook)."""
        from torch.nn.modules import module as nn_module

        pre = getattr(nn_module, "register_module_forward_pre_hook", None)
        post = getattr(nn_module, "register_module_forward_hook", None)
        if pre is None or post is None:  # pragma: no cover - every torch since 1.13 has them
            return
        self._handles.append(pre(self._forward_pre_hook))
        self._handles.append(post(self._forward_hook))

    def _forward_pre_hook(self, module: Any, inputs: Any) -> None:
        # The module path: a module's name is its parent's (the module
        # whose forward is running) and its attribute there, found once.
        stack = self._stack
        if id(module) not in self._names:
            name = type(module).__name__
            if stack:
                parent = stack[-1]
                for key, child in getattr(parent, "_modules", {}).items():
                    if child is module:
                        name = f"{self._names.get(id(parent), type(parent).__name__)}.{key}"
                        break
            self._names[id(module)] = name
        if len(stack) > 256:
            stack.clear()  # forwards that raised left their modules: start over
        stack.append(module)

    def _forward_hook(self, module: Any, inputs: Any, output: Any) -> None:
        stack = self._stack
        if stack and stack[-1] is module:
            stack.pop()
        node = getattr(output, "grad_fn", None)
        if node is None and isinstance(output, (tuple, list)) and output:
            node = getattr(output[0], "grad_fn", None)
        if node is None or not hasattr(node, "register_prehook"):
            return
        name = self._names.get(id(module), type(module).__name__)

        def prehook(grad_outputs: Any) -> None:
            self.record(name)

        try:
            node.register_prehook(prehook)
        except Exception:  # noqa: BLE001 - a node that takes no hook: unnamed
            pass

    def close(self) -> None:
        for h in self._handles:
            try:
                h.remove()
            except Exception:  # noqa: BLE001
                pass
        self._handles.clear()
