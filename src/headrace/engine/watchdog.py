"""``process_timeout_s``: a per-invocation watchdog for user code that runs too long.

On the main thread of a POSIX process (the ``Harness``, a PySpark Python worker), a one-shot
``SIGALRM`` (``signal.setitimer``) raises in the invocation when it is due: it interrupts Python
code and blocking calls that return ``EINTR`` (``time.sleep``, socket reads). Elsewhere, a monitor
thread raises it in the invocation's thread with ``PyThreadState_SetAsyncExc``: that takes effect
at the thread's next Python bytecode, so a call into C that never returns is not interrupted (nor,
on the main thread, one that retries on ``EINTR`` or holds the GIL). The watchdog raises a
``BaseException`` (``except Exception`` in user code does not swallow it); the engine turns it
into a ``UserCodeError`` under ``on_error="fail"``, or a dead letter.
"""

from __future__ import annotations

import ctypes
import signal
import threading
import time
from typing import Any, Callable

from ..errors import HeadraceError

__all__ = ["ProcessTimeout", "ProcessTimeoutError", "guarded"]


class ProcessTimeout(BaseException):
    """Raised inside user code when its invocation is due (not an ``Exception``, so it is not caught
    by user code's own handlers)."""


class ProcessTimeoutError(HeadraceError):
    """An invocation of user code ran longer than ``process_timeout_s``."""


class _Monitor(threading.Thread):
    """One daemon thread per process: raises ``ProcessTimeout`` in an invocation past its deadline."""

    def __init__(self) -> None:
        super().__init__(name="headrace-watchdog", daemon=True)
        self.wake = threading.Condition()
        self.watched: dict[int, float] = {}  # thread id -> deadline (time.monotonic)

    def run(self) -> None:
        while True:
            with self.wake:
                now = time.monotonic()
                for tid, deadline in list(self.watched.items()):
                    if deadline <= now:
                        del self.watched[tid]
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), ctypes.py_object(ProcessTimeout))
                soonest = min(self.watched.values(), default=None)
                self.wake.wait(None if soonest is None else max(soonest - now, 0.001))


_monitor: _Monitor | None = None
_monitor_lock = threading.Lock()


def _alarm(signum: int, frame: Any) -> None:
    raise ProcessTimeout()


class _Guard:
    __slots__ = ("seconds", "what")

    def __init__(self, seconds: float, what: str):
        self.seconds, self.what = seconds, what

    def __call__(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
                self._on_main(fn, args)
            else:
                self._on_thread(fn, args)
        except ProcessTimeout:
            raise ProcessTimeoutError(f"{self.what} ran longer than process_timeout_s={self.seconds:g}",
                                      got_text=f"stopped after {self.seconds:g} s",
                                      hint="make it faster, or raise process_timeout_s") from None

    def _on_main(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        previous = signal.signal(signal.SIGALRM, _alarm)
        started = time.monotonic()
        other, interval = signal.setitimer(signal.ITIMER_REAL, self.seconds)  # someone else's alarm, if any
        try:
            fn(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if other > 0:  # put it back, less the time gone (a due one fires at once)
                signal.setitimer(signal.ITIMER_REAL, max(other - (time.monotonic() - started), 1e-6), interval)

    def _on_thread(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        global _monitor
        with _monitor_lock:
            if _monitor is None:
                _monitor = _Monitor()
                _monitor.start()
        monitor, tid = _monitor, threading.get_ident()
        with monitor.wake:
            monitor.watched[tid] = time.monotonic() + self.seconds
            monitor.wake.notify()
        try:
            fn(*args)
        finally:
            with monitor.wake:
                if monitor.watched.pop(tid, None) is None:  # it fired: clear a raise not yet taken
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), None)


def guarded(fn: Callable[..., None], seconds: float | None, what: str) -> Callable[..., None]:
    """``fn`` under a watchdog of ``seconds`` (``fn`` itself without one)."""
    if seconds is None:
        return fn
    guard = _Guard(seconds, what)
    return lambda *args: guard(fn, *args)
