"""Patches that close moto 5.2.5's gaps for the twin; `install()` applies them all, once.

They replace methods on moto's backend and response classes, which both `mock_aws` and moto's server mode
(ThreadedMotoServer in this process) use, so one install serves both. Each patch reaches into moto's
internals, which is why moto is pinned exactly and `install()` refuses any other version.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading

import moto

from lustrain.twin.patches import (
    answers,
    asl_parse,
    dispatch,
    dynamodb_wire,
    dynamodb_writes,
    ec2,
    eventbridge,
    fsx,
    iam,
    lambda_invoke,
    loaders,
    logs,
    offerings,
    s3,
    service_quotas,
    stepfunctions,
    throttling,
    validation,
)

MOTO_VERSION = "5.2.5"

_lock = threading.Lock()
_installed = False


class MotoVersionMismatch(RuntimeError):
    """The installed moto is not the version whose internals the twin's patches were written against."""


def check_moto_version(found: str | None = None) -> None:
    found = moto.__version__ if found is None else found
    if found != MOTO_VERSION:
        raise MotoVersionMismatch(
            f"the twin patches moto {MOTO_VERSION}'s internals; upgrade them together "
            f"(installed moto is {found}; pin moto=={MOTO_VERSION} or port lustrain/twin/patches)"
        )


def install() -> None:
    """Apply every patch (idempotent); sagemaker.py's too when that module is present."""
    global _installed
    with _lock:
        if _installed:
            return
        check_moto_version()
        loaders.install()
        dispatch.install()
        answers.install()
        dynamodb_wire.install()
        dynamodb_writes.install()
        asl_parse.install()
        lambda_invoke.install()
        throttling.install()
        iam.install()
        service_quotas.install()
        fsx.install()
        eventbridge.install()
        ec2.install()
        offerings.install()
        validation.install()
        stepfunctions.install()
        s3.install()
        logs.install()
        if importlib.util.find_spec(f"{__name__}.sagemaker") is not None:
            importlib.import_module(f"{__name__}.sagemaker").install()
            importlib.import_module(f"{__name__}.processing").install()
        _installed = True
