"""lustrain's CLI and local twin (not deployed to Lambda), and its Python API for a notebook:

    import lustrain
    stack = lustrain.Stack.locate("lustrain")                 # a deployed stack (or the twin's, lustrain-twin)
    lustrain.submit.submit("gpt.yaml", jobs_bucket=stack.jobs_bucket, artifacts_bucket=stack.artifacts_bucket)
    for look in lustrain.watch(stack, "gpt"): ...             # lustrain.runs, status, logs, progress, cancel too
    lustrain.leftovers(stack).billing                          # what the stack's runs still hold that bills
    lustrain.report.build(stack, "gpt", "reports")            # the report, with the data of each figure
    lustrain.export.export("gpt", Path("hf"), s3=lambda: stack.client("s3"), stack=lambda: stack)  # for transformers

The operator calls are lustrain.operate's and lustrain.cleanup's, loaded on first use (so that `lustrain plan` stays quick).
"""

from __future__ import annotations

import importlib
from typing import Any

_OPERATE = frozenset({"Stack", "runs", "status", "watch", "progress", "logs", "cancel", "find_run"})
_CLEANUP = frozenset({"leftovers", "wait_for_teardown"})


def __getattr__(name: str) -> Any:
    if name in _OPERATE:
        return getattr(importlib.import_module("lustrain.operate"), name)
    if name in _CLEANUP:
        return getattr(importlib.import_module("lustrain.cleanup"), name)
    if name in {"submit", "report", "operate", "export"}:
        return importlib.import_module(f"lustrain.{name}")
    raise AttributeError(f"module 'lustrain' has no attribute {name!r}")
