"""Raising an exception in another thread of this process: how a watching thread ends a run it has given up on."""

from __future__ import annotations

import ctypes


def raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in thread ``thread_id`` when it next runs Python code; None withdraws a pending one.

    Not a signal: it reaches whichever thread runs the work (see :mod:`.execution.watchdog`). A thread blocked in C
    code gets it once that returns.

    :param thread_id: the thread's ``threading.get_ident()``.
    :param exc: an exception class (Python makes the instance), or None.
    """
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc else None)
