"""SendTaskFailure keeps its cause.

moto 5.2.5's StepFunctionResponse.send_task_failure passes only the error to the backend, so an execution failed
by callback (on_training_event reporting TrainingFailed with SageMaker's FailureReason) ends with no Cause,
where AWS keeps it. The ASL-executing backend already takes a cause; the patch hands it over.
"""

from __future__ import annotations

from moto.core.responses import ActionResult, EmptyResult
from moto.stepfunctions.parser.models import StepFunctionsParserBackend
from moto.stepfunctions.responses import StepFunctionResponse

_PATCHED = "_lustrain_twin_cause"


def send_task_failure(self: StepFunctionResponse) -> ActionResult:
    backend = self.stepfunction_backend
    token, error = self._get_param("taskToken"), self._get_param("error")
    if isinstance(backend, StepFunctionsParserBackend):
        backend.send_task_failure(token, error=error, cause=self._get_param("cause"))
    else:
        backend.send_task_failure(token, error=error)
    return EmptyResult()


def install() -> None:
    if getattr(StepFunctionResponse, _PATCHED, False):
        return
    StepFunctionResponse.send_task_failure = send_task_failure  # type: ignore[method-assign]
    setattr(StepFunctionResponse, _PATCHED, True)
