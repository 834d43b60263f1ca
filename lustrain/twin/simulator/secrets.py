"""Secrets Manager and SSM as a training job reaches them: through its VPC's interface endpoints, as its role.

On AWS, lustrain's secrets launcher (lustrain_core/secrets_launcher.py) runs inside the job and calls
GetSecretValue / GetParameter by the services' own names, which the run's interface endpoints answer through private
DNS. Here the job is a process of this machine, and moto's backends live in this one (under mock_aws they have no
address at all), so each job gets a small HTTP stand-in for those endpoints on 127.0.0.1, named to the job's SDK by
the service-specific endpoint variables (AWS_ENDPOINT_URL_SECRETS_MANAGER, AWS_ENDPOINT_URL_SSM). What the real
network and IAM would do, it does:
- a service the job's network cannot reach (network.py: no interface endpoint with private DNS in its VPC, or
  security groups that keep HTTPS from it) gets an address where nothing listens: the SDK's connection fails, as it
  times out on AWS;
- every call is authorized as the job's execution role (the twin's IAM: secretsmanager:GetSecretValue on the
  secret's ARN, ssm:GetParameter on the parameter's), and refused with AWS's AccessDeniedException;
- the value comes from moto's backend (a SecureString decrypted), the errors are the services' own (not found).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from botocore.exceptions import ClientError

from lustrain.twin.simulator import endpoint

#: the SDK's service-specific endpoint variables (botocore's service id, upper-cased, spaces to underscores)
ENDPOINT_VARIABLES = {"secretsmanager": "AWS_ENDPOINT_URL_SECRETS_MANAGER", "ssm": "AWS_ENDPOINT_URL_SSM"}
#: X-Amz-Target of the calls served (both services speak the JSON 1.1 protocol)
TARGETS = {
    "secretsmanager.GetSecretValue": ("secretsmanager", "GetSecretValue"),
    "AmazonSSM.GetParameter": ("ssm", "GetParameter"),
}

#: authorize(service, operation, params): raise the service's ClientError when the job's role may not
Authorize = Callable[[str, str, dict[str, Any]], None]
#: problem(service): why the job's network cannot reach the service, or None
Reachability = Callable[[str], str | None]



def _answer(
    service: str, operation: str, params: dict[str, Any], account: str, region: str
) -> dict[str, Any]:
    if service == "secretsmanager":
        from moto.secretsmanager.models import secretsmanager_backends

        backend = secretsmanager_backends[account][region]
        return dict(
            backend.get_secret_value(
                secret_id=params.get("SecretId", ""),
                version_id=params.get("VersionId"),  # type: ignore[arg-type]  # moto's None default
                version_stage=params.get("VersionStage"),  # type: ignore[arg-type]
            )
        )
    from moto.ssm.exceptions import ParameterNotFound
    from moto.ssm.models import ssm_backends

    name = str(params.get("Name", ""))
    found = ssm_backends[account][region].get_parameter(name)
    if found is None:
        raise ParameterNotFound(f"Parameter {name} not found.")
    return {"Parameter": found.response_object(bool(params.get("WithDecryption")), region)}


class SecretsEndpoints:
    """One job's way to Secrets Manager and SSM: start() before the job's process, environment() for it, close()."""

    def __init__(self, account: str, region: str, authorize: Authorize, reachability: Reachability) -> None:
        self.account = account
        self.region = region
        self.authorize = authorize
        self.reachability = reachability
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        endpoints = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                status, answer = endpoints.handle(str(self.headers.get("X-Amz-Target", "")), body)
                data = json.dumps(answer, default=str).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = endpoint.serve(Handler)

    def environment(self) -> dict[str, str]:
        """The job's endpoint variables: the stand-in for a service its network reaches, a dead address otherwise."""
        assert self._server is not None, "start() first"
        served = endpoint.address(self._server)
        return {
            variable: served if self.reachability(service) is None else endpoint.unused_address()
            for service, variable in ENDPOINT_VARIABLES.items()
        }

    def handle(self, target: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """One call: (HTTP status, the JSON answer or the service's error)."""
        call = TARGETS.get(target)
        if call is None:
            return 400, {
                "__type": "UnknownOperationException",
                "message": f"the twin serves no {target!r} here",
            }
        service, operation = call
        try:
            params = json.loads(body or b"{}")
            self.authorize(service, operation, params)
            return 200, _answer(service, operation, params, self.account, self.region)
        except ClientError as refused:
            error = refused.response.get("Error", {})
            status = int(refused.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 400))
            return status, {
                "__type": error.get("Code", "AccessDeniedException"),
                "message": error.get("Message", ""),
            }
        except Exception as failed:
            code = getattr(failed, "error_type", type(failed).__name__)
            return int(getattr(failed, "code", 400)), {
                "__type": code,
                "message": getattr(failed, "message", str(failed)),
            }

    def close(self) -> None:
        endpoint.close(self._server)
        self._server = None
