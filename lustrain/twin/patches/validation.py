"""SageMaker and FSx refuse a request outside their API model's limits; moto 5.2.5 takes it.

botocore validates types and minimums before sending, not maximum lengths, patterns or counts: AWS checks those on
its side and answers (SageMaker's code ValidationException; FSx's BadRequest, as CloudFormation users have reported
it verbatim: "... failed to satisfy constraint: ... (Service: AmazonFSx; Status Code: 400; Error Code: BadRequest)")
"1 validation error detected: Value '...' at 'tags.1.member.value' failed
to satisfy constraint: Member must satisfy regular expression pattern: ...". The twin does the same, from the same
model (lustrain_core.limits walks it), where moto answers a request (so for the AWS CLI against `lustrain local up`
too): a request lustrain's compiler missed fails here as it would on AWS.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from lustrain_core import limits
from moto.core.exceptions import JsonRESTError
from moto.fsx.responses import FSxResponse
from moto.sagemaker.responses import SageMakerResponse

_PATCHED = "_lustrain_twin_model_limits"
#: moto's response class of each service checked, its name in botocore, and the code AWS answers a refusal with
RESPONSES: dict[Any, tuple[str, str]] = {
    SageMakerResponse: ("sagemaker", "ValidationException"),
    FSxResponse: ("fsx", "BadRequest"),
}


def check(service: str, code: str, operation: str, params: Any) -> None:
    """The service's refusal, as AWS words it, when `params` break the operation's model."""
    if isinstance(params, dict):
        found = limits.problems(service, operation, params)
        if found:
            raise JsonRESTError(code, limits.validation_message(found))


def install() -> None:
    for response, (service, code) in RESPONSES.items():
        original = response.call_action
        if getattr(original, _PATCHED, False):
            continue

        def call_action(
            self: Any, _original: Any = original, _service: str = service, _code: str = code
        ) -> Any:
            try:
                params = json.loads(self.body) if self.body else {}
            except (TypeError, ValueError):
                params = None
            check(_service, _code, self._get_action(), params)
            return _original(self)

        functools.update_wrapper(call_action, original)
        setattr(call_action, _PATCHED, True)
        response.call_action = call_action
