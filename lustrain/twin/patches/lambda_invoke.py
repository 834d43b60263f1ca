"""Lambda Invoke without Docker: the function's handler runs in this process.

moto 5.2.5 runs a function in a Docker container from `LambdaFunction._invoke_lambda(event)`, which returns
`(payload, errored, logs)`. The patch imports the module named by the function's Handler
("handlers.register_job.handler" -> module handlers.register_job, attribute handler) and calls it with the
event and a Lambda context object, under the function's environment.

How Step Functions sees a failed invocation (read in moto/stepfunctions/parser, LocalStack's interpreter):
moto answers the errored Invoke with the X-Amz-Function-Error header; the engine's Lambda client sees
`FunctionError` in the response and raises LambdaFunctionErrorException carrying the payload
(lambda_eval_utils.py). `StateTaskServiceLambda._from_error` (arn:aws:states:::lambda:invoke, with or without
.waitForTaskToken) and `StateTaskLambda._from_error` (a bare function ARN) parse the payload as JSON and use its
`errorType` as the error name (a CustomErrorName, which is what Retry/Catch ErrorEquals match) and the payload
string as the Cause; a payload without errorType becomes the error "Exception". AWS behaves the same way, so
an exception class name is the ErrorEquals of the ASL, here as there.

Payloads follow AWS's Python runtime: `{"errorMessage", "errorType", "requestId", "stackTrace"}` for a raised
exception, `Runtime.ImportModuleError` / `Runtime.HandlerNotFound` / `Runtime.MarshalError` for a handler that
cannot be loaded or whose result is not JSON, and FunctionError "Unhandled" (moto says "Handled").

Timeout: AWS stops a function at its Timeout and answers Invoke with FunctionError "Unhandled" and the payload
`{"errorType": "Sandbox.Timedout", "errorMessage": "RequestId: <id> Error: Task timed out after N.00 seconds"}`
(the current runtimes, python3.12 included; older ones sent no errorType, which Step Functions then reported
as Lambda.Unknown, as its documentation still says). Step Functions therefore sees the error
"Sandbox.Timedout", which Retry/Catch can name, and which States.ALL and States.TaskFailed also match. The twin
answers the same way when the handler runs past the function's Timeout. A Python thread cannot be killed: the
handler keeps running in the background, outside the environment lock, until it returns on its own. The
`lambda-timeout` fault (faults.py) gives the same answer for one invocation without the wait: the handler runs to
its end, so what it did stays done, and only its answer is lost (the hardest case for whoever retries or
compensates: everything was created, nothing was reported). `timeout-mid-delete` answers the same the moment the
handler makes its first Delete* call, and lets the handler go on, as the real timeout above does: the retry runs
beside it. `twice-at-once` runs the handler twice at once on the same event.

Asynchronous invocations (InvocationType Event: EventBridge's deliveries, S3 notifications) that fail are
retried as Lambda retries them: up to the function's MaximumRetryAttempts (its EventInvokeConfig; AWS's default
is 2), after ASYNC_RETRY_DELAYS_S, the twin's seconds for AWS's one and two minutes. The caller's thread waits
for the retries; what it gets is the last attempt's answer.

The process has one environment, and on AWS each function has its own: the function's Environment Variables
(plus its role's credentials, AWS_REGION, AWS_LAMBDA_FUNCTION_NAME, ...) are therefore an overlay of os.environ
that only the invocation's thread (and the threads that copy its context) sees (`_ContextualEnviron`). Every
other thread goes on reading the process's own: the operator's credentials stay the operator's while a function
runs. (When the runner wrote them into os.environ, a `lustrain status` made by a test beside a running teardown
signed as the teardown's role, and a boto3 default session first used then kept that role for the rest of the
process.) Invocations are still serialised by a lock; one made from inside a handler in this process (mock_aws:
the nested call runs in the handler's own thread) re-enters without it. Threads that read the whole
environment (botocore looks up proxies in it each time a client is created) hold ENVIRONMENT_LOCK, as do the
twin's own changes (`environment_copy()` and `restore_environment()`). In moto's server mode a nested
*synchronous* invoke arrives
on another server thread and would wait for the lock forever; it fails after LOCK_WAIT_S instead. In server
mode the handler's boto3 calls go to the server: AWS_ENDPOINT_URL is set to http://localhost:$MOTO_PORT unless
the process or the function already sets it. Handler output goes to the process's stdout, not CloudWatch; the
function's log group gets the START/END/REPORT lines and any error.
"""

from __future__ import annotations

import contextvars
import copy
import decimal
import functools
import importlib
import json
import os
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import boto3
import botocore.endpoint
from moto import settings as moto_settings
from moto.awslambda.models import LambdaFunction
from moto.core.models import botocore_stubber

from lustrain.twin import faults
from lustrain.twin.iam import enforce

LAMBDA_SERVICE = "lambda.amazonaws.com"

#: How long an invocation waits for another one to release the process environment.
LOCK_WAIT_S = 900.0
#: The waits before each retry of a failed asynchronous invocation (AWS: about 1 and 2 minutes; MaximumRetryAttempts
#: is 0 to 2 on AWS, so there is never a third).
ASYNC_RETRY_DELAYS_S: tuple[float, ...] = (1.0, 2.0)
#: Lambda retries a failed asynchronous invocation this many times unless the function's EventInvokeConfig
#: says otherwise.
DEFAULT_ASYNC_RETRIES = 2

_PATCHED = "_lustrain_twin_in_process"
_env_lock = threading.Lock()
#: Held while the process environment changes, and by whoever reads all of it (see the module's notes).
ENVIRONMENT_LOCK = threading.RLock()
#: An invocation's boto3 default session, made at its first boto3.client() (empty until then).
_default_session: contextvars.ContextVar[list[boto3.session.Session] | None] = contextvars.ContextVar(
    "lustrain_twin_default_session", default=None
)
_process_default_session = boto3._get_default_session
_inside_invocation: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "lustrain_twin_inside_invocation", default=False
)


@dataclass
class LambdaContext:
    """The attributes of AWS's Python runtime context that handlers and Powertools read."""

    function_name: str
    function_version: str
    invoked_function_arn: str
    memory_limit_in_mb: int
    aws_request_id: str
    log_group_name: str
    log_stream_name: str
    timeout_s: float
    _started: float = field(default_factory=time.monotonic)
    identity: Any = None
    client_context: Any = None

    def get_remaining_time_in_millis(self) -> int:
        left = self.timeout_s - (time.monotonic() - self._started)
        return max(0, int(left * 1000))


@dataclass
class _Outcome:
    payload: str = ""
    errored: bool = False
    error_line: str = ""


def _decimal_as_number(value: Any) -> Any:
    # AWS's runtime marshaller writes Decimal (what DynamoDB returns) as a JSON number.
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _error(error_type: str, message: str, request_id: str, stack: list[str] | None = None) -> _Outcome:
    body = {
        "errorMessage": message,
        "errorType": error_type,
        "requestId": request_id,
        "stackTrace": stack or [],
    }
    return _Outcome(json.dumps(body), True, f"[ERROR] {error_type}: {message}")


def _load_handler(handler: str, request_id: str) -> Callable[[Any, LambdaContext], Any] | _Outcome:
    module_name, _, attribute = handler.rpartition(".")
    if not module_name:
        return _error(
            "Runtime.MalformedHandlerName",
            f"Bad handler '{handler}': not enough values to unpack (expected 2, got 1)",
            request_id,
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        return _error(
            "Runtime.ImportModuleError", f"Unable to import module '{module_name}': {exc}", request_id
        )
    function = getattr(module, attribute, None)
    if not callable(function):
        return _error(
            "Runtime.HandlerNotFound", f"Handler '{attribute}' missing on module '{module_name}'", request_id
        )
    return function  # type: ignore[no-any-return]


def _call(function: Callable[[Any, LambdaContext], Any], event: Any, context: LambdaContext) -> _Outcome:
    try:
        result = function(event, context)
    except Exception as exc:
        stack = traceback.format_list(traceback.extract_tb(exc.__traceback__))
        return _error(type(exc).__name__, str(exc), context.aws_request_id, stack)
    try:
        return _Outcome(json.dumps(result, default=_decimal_as_number))
    except (TypeError, ValueError) as exc:
        return _error("Runtime.MarshalError", f"Unable to marshal response: {exc}", context.aws_request_id)


def _environment(fn: LambdaFunction) -> dict[str, str]:
    """What the function's process sees: Lambda's variables, its execution role's session credentials, its own."""
    _, credentials = enforce.assume(
        str(fn.role),
        fn.function_name,
        service=LAMBDA_SERVICE,
        source_account=fn.account_id,
        source_arn=fn.function_arn,
    )
    env = {
        **credentials,
        "AWS_REGION": fn.region,
        "AWS_DEFAULT_REGION": fn.region,
        "AWS_LAMBDA_FUNCTION_NAME": fn.function_name,
        "AWS_LAMBDA_FUNCTION_VERSION": str(fn.version),
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(fn.memory_size),
        "AWS_LAMBDA_LOG_GROUP_NAME": fn.logs_group_name,
        "_HANDLER": fn.handler,
    }
    if not botocore_stubber.enabled and "AWS_ENDPOINT_URL" not in os.environ:
        # Server mode: nothing intercepts boto3 in this process, so its calls must reach the server.
        env["AWS_ENDPOINT_URL"] = f"http://localhost:{moto_settings.moto_server_port()}"
    env.update({key: str(value) for key, value in (fn.environment_vars or {}).items()})
    return env


def environment_copy() -> dict[str, str]:
    """The whole process environment, read while no invocation changes it."""
    with ENVIRONMENT_LOCK:
        return dict(os.environ)


def restore_environment(saved: dict[str, str]) -> None:
    """Put the process environment back to `saved`, key by key and while no invocation changes it: threads that
    outlive a twin (a handler past its timeout, a Lambda retry) never see it empty."""
    with ENVIRONMENT_LOCK:
        for key in set(os.environ) - set(saved):
            os.environ.pop(key, None)
        for key, value in saved.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


#: The environment of the invocation whose thread reads os.environ: its variables, and None for one it removed.
_overlay: contextvars.ContextVar[dict[str, str | None] | None] = contextvars.ContextVar(
    "lustrain_twin_environment", default=None
)


class _ContextualEnviron(os._Environ):  # type: ignore[type-arg]
    """os.environ as each thread's Lambda function sees it: the process's variables under its invocation's own
    (`_overlay`), which it may also change; a thread outside any invocation sees the process's alone."""

    def __getitem__(self, key: str) -> str:
        overlay = _overlay.get()
        if overlay is not None and key in overlay:
            value = overlay[key]
            if value is None:
                raise KeyError(key)
            return value
        return str(super().__getitem__(key))

    def __setitem__(self, key: str, value: str) -> None:
        overlay = _overlay.get()
        if overlay is None:
            super().__setitem__(key, value)
        else:
            overlay[key] = str(value)

    def __delitem__(self, key: str) -> None:
        overlay = _overlay.get()
        if overlay is None:
            super().__delitem__(key)
        elif key in self:
            overlay[key] = None
        else:
            raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        overlay = _overlay.get()
        if overlay is None:
            yield from super().__iter__()
            return
        seen = set(overlay)
        yield from (key for key, value in overlay.items() if value is not None)
        yield from (key for key in list(super().__iter__()) if key not in seen)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def copy(self) -> dict[str, str]:
        return dict(self)


def _install_contextual_environ() -> None:
    if isinstance(os.environ, _ContextualEnviron):
        return
    # the same variables (the process's own, which putenv keeps for subprocesses), read through the overlay
    base: Any = os.environ
    contextual = _ContextualEnviron(
        base._data, base.encodekey, base.decodekey, base.encodevalue, base.decodevalue
    )
    os.environ = contextual  # noqa: B003 - replaces the mapping, sharing its variables


def _invocation_session() -> boto3.session.Session:
    """boto3's default session as a handler sees it: its invocation's own, as in a fresh Lambda process. A
    botocore session keeps the credentials it resolved first, so one shared default session would sign, for the
    rest of the process, as whichever role (or caller) asked first."""
    own = _default_session.get()
    if own is None:
        return _process_default_session()
    if not own:
        own.append(boto3.session.Session())
    return own[0]


def _reading_whole_environment(read: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(read)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with ENVIRONMENT_LOCK:
            return read(*args, **kwargs)

    return locked


@contextmanager
def _serialised(function_name: str) -> Iterator[None]:
    if _inside_invocation.get():
        yield
        return
    if not _env_lock.acquire(timeout=LOCK_WAIT_S):
        raise RuntimeError(
            f"the twin could not run Lambda function {function_name!r}: another in-process invocation held the "
            f"process environment for {LOCK_WAIT_S:.0f} s (a synchronous invoke from inside a handler "
            "deadlocks in moto's server mode; invoke asynchronously or through EventBridge)"
        )
    try:
        yield
    finally:
        _env_lock.release()


def _step_of(handler: str) -> str:
    return handler.rpartition(".")[0].rpartition(".")[2]


def _event_object(event: Any) -> Any:
    # moto passes the parsed JSON body, or the string "{}" when the body was empty.
    if isinstance(event, str | bytes):
        try:
            return json.loads(event)
        except ValueError:
            return event
    return {} if event is None else event


def _run(fn: LambdaFunction, event: Any, request_id: str) -> _Outcome:
    timeout_s = float(fn.timeout)
    context = LambdaContext(
        function_name=fn.function_name,
        function_version=str(fn.version),
        invoked_function_arn=fn.function_arn,
        memory_limit_in_mb=int(fn.memory_size),
        aws_request_id=request_id,
        log_group_name=fn.logs_group_name,
        log_stream_name=f"{time.strftime('%Y/%m/%d')}/[{fn.version}]{request_id.replace('-', '')}",
        timeout_s=timeout_s,
    )
    box: list[_Outcome] = []
    handler = str(fn.handler)
    step = _step_of(handler)

    # set when the invocation has an answer: its handler returned, or the `timeout-mid-delete` fault cut it short
    settled = threading.Event()
    cut = threading.Event()

    def cut_short() -> None:
        cut.set()
        settled.set()

    def invocation() -> None:
        _inside_invocation.set(True)
        _default_session.set([])
        _overlay.set({**(_overlay.get() or {}), **environment})
        try:
            with faults.running_step(step, event, cut=cut_short):
                timed_out = faults.consume(step, "lambda-timeout")
                loaded = _load_handler(handler, request_id)
                if isinstance(loaded, _Outcome):
                    outcome = loaded
                elif faults.consume(step, "twice-at-once"):
                    outcome = _twice_at_once(loaded, event, context)
                else:
                    outcome = _call(loaded, event, context)
                box.append(_timed_out(request_id, timeout_s) if timed_out else outcome)
        finally:
            settled.set()

    try:
        environment = _environment(fn)
    except enforce.NotAssumable as exc:
        return _error(
            "InvalidParameterValueException",
            f"The role defined for the function cannot be assumed by Lambda. ({exc})",
            request_id,
        )
    with _serialised(fn.function_name):
        worker = threading.Thread(
            target=contextvars.copy_context().run,
            args=(invocation,),
            name=f"lambda:{fn.function_name}:{request_id[:8]}",
            daemon=True,
        )
        worker.start()
        settled.wait(timeout_s)
    return box[0] if box and not cut.is_set() else _timed_out(request_id, timeout_s)


def _twice_at_once(
    function: Callable[[Any, LambdaContext], Any], event: Any, context: LambdaContext
) -> _Outcome:
    """The `twice-at-once` fault: the handler runs twice at once on copies of one event; the answer is the
    first failure, if either failed (whoever ran it would retry), else the first run's."""
    outcomes: list[_Outcome] = []
    other = threading.Thread(
        target=contextvars.copy_context().run,
        args=(lambda: outcomes.append(_call(function, copy.deepcopy(event), context)),),
        name=f"{threading.current_thread().name}:twice",
        daemon=True,
    )
    other.start()
    mine = _call(function, event, context)
    other.join()
    return next((o for o in (mine, *outcomes) if o.errored), mine)


def _timed_out(request_id: str, timeout_s: float) -> _Outcome:
    message = f"RequestId: {request_id} Error: Task timed out after {timeout_s:.2f} seconds"
    return _Outcome(json.dumps({"errorType": "Sandbox.Timedout", "errorMessage": message}), True, message)


def _async_retries(fn: LambdaFunction) -> int:
    # moto appends a config per Put/Update call: the latest one is in force
    for config in reversed(getattr(fn, "event_invoke_config", None) or []):
        if "MaximumRetryAttempts" in config.config:
            return int(config.config["MaximumRetryAttempts"])
    return DEFAULT_ASYNC_RETRIES


def invoke_in_process(self: LambdaFunction, event: Any = None) -> tuple[str, bool, str]:
    """Replacement for LambdaFunction._invoke_lambda: run the handler here, answer as AWS does."""
    request_id = str(uuid.uuid4())
    started = time.monotonic()
    outcome = _run(self, _event_object(event), request_id)
    duration_ms = (time.monotonic() - started) * 1000
    lines = [f"START RequestId: {request_id} Version: {self.version}"]
    if outcome.error_line:
        lines.append(outcome.error_line)
    lines += [
        f"END RequestId: {request_id}",
        f"REPORT RequestId: {request_id}\tDuration: {duration_ms:.2f} ms\tMemory Size: {self.memory_size} MB",
    ]
    logs = "\n".join(lines)
    self.logs_backend.ensure_log_group(self.logs_group_name)
    self.save_logs(logs)
    return outcome.payload, outcome.errored, logs


def install() -> None:
    if getattr(LambdaFunction._invoke_lambda, _PATCHED, False):
        return
    setattr(invoke_in_process, _PATCHED, True)
    _install_contextual_environ()
    LambdaFunction._invoke_lambda = invoke_in_process  # type: ignore[method-assign]
    # every client creation, in any thread, reads the whole environment here (proxy variables)
    botocore.endpoint.get_environ_proxies = _reading_whole_environment(botocore.endpoint.get_environ_proxies)
    boto3._get_default_session = _invocation_session

    original_invoke = LambdaFunction.invoke

    @functools.wraps(original_invoke)
    def invoke(self: LambdaFunction, body: str, request_headers: Any, response_headers: Any) -> str | bytes:
        result = original_invoke(self, body, request_headers, response_headers)
        if request_headers.get("x-amz-invocation-type") == "Event":
            for delay in ASYNC_RETRY_DELAYS_S[: _async_retries(self)]:
                if not response_headers.get("x-amz-function-error"):
                    break
                time.sleep(delay)
                response_headers.pop("x-amz-function-error", None)
                result = original_invoke(self, body, request_headers, response_headers)
        # An exception the handler does not catch is "Unhandled" on AWS's Python runtime.
        if response_headers.get("x-amz-function-error") == "Handled":
            response_headers["x-amz-function-error"] = "Unhandled"
        return result

    LambdaFunction.invoke = invoke  # type: ignore[method-assign]
