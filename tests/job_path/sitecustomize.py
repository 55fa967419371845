"""Loaded by Python at start when this folder is on PYTHONPATH (tests/test_job_path.py):
counts the calls of every function of forkq's modules in each process, written to
``$FORKQ_TRACE_DIR/<pid>.json`` every few thousand calls (children end by ``os._exit``)."""

import collections
import json
import os
import sys
import threading

if os.environ.get("FORKQ_TRACE_DIR"):
    _counts: collections.Counter[str] = collections.Counter()
    _root = os.path.join(os.environ["FORKQ_TRACE_ROOT"], "forkq") + os.sep
    _calls = [0]

    def _dump() -> None:
        path = os.path.join(os.environ["FORKQ_TRACE_DIR"], f"{os.getpid()}.json")
        with open(path, "w") as out:
            json.dump(dict(_counts), out)

    def _profile(frame, event, arg):  # type: ignore[no-untyped-def]
        if event != "call":
            return
        name = frame.f_code.co_filename
        if name.startswith(_root):
            _counts[name[len(_root):]] += 1
            _calls[0] += 1
            if _calls[0] % 2000 == 0:
                _dump()

    sys.setprofile(_profile)
    threading.setprofile(_profile)
