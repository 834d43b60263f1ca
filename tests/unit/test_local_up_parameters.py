"""`lustrain local up --param/--webhook/--mlflow` refuses bad input before the twin starts, naming the option and the
value that failed, and holds a parameter to the template's constraints as CloudFormation holds it."""

from __future__ import annotations

import argparse

import pytest
from lustrain_core.errors import UsageInvalid

from lustrain.twin.commands import local_up_parameters


def refused(param: list[str] | None = None, webhook: str | None = None, mlflow: str | None = None) -> str:
    with pytest.raises(UsageInvalid) as exc:
        local_up_parameters(argparse.Namespace(param=param or [], webhook=webhook, mlflow=mlflow))
    (error,) = exc.value.errors
    return f"{error.path}: {error.message} (got {str(exc.value).rsplit('(got ', 1)[-1]}"


def test_bad_input_names_its_option_and_the_value_that_failed():
    assert refused(["LogLevel"]).startswith("--param: is NAME=VALUE")
    assert refused(["LogLevel=INFO", "LogLevel=DEBUG"]).startswith("--param: names LogLevel a second time")
    said = refused(["LogLevel=DEBUG", "MaxInstancesPerRun=abc"])
    assert "Parameter 'MaxInstancesPerRun' must be a number" in said and "got 'MaxInstancesPerRun=abc'" in said
    assert "must be one of AllowedValues" in refused(["LogLevel=LOUD"])
    assert "unknown template parameters ['Nope']" in refused(["Nope=1"])
    assert refused(webhook="https://hooks.slack.com/x").startswith("--webhook: the twin reaches nothing off")
    assert refused(webhook="http://127.0.0.1:99999/h").startswith("--webhook: the twin reaches nothing off")
    assert refused(mlflow="http://127.0.0.1:5000/x").startswith("--mlflow: is the tracking server's root")
    assert refused(["MlflowTrackingUri=x"], mlflow="http://127.0.0.1:5000").startswith("--mlflow: and --param")


def test_good_input_becomes_the_stacks_parameters():
    given = local_up_parameters(argparse.Namespace(param=["MaxBudgetUsdPerRun=5000"], webhook="http://127.0.0.1:8/h",
                                                   mlflow="http://127.0.0.1:5001/"))
    assert given == {"MaxBudgetUsdPerRun": "5000", "MlflowTrackingUri": "http://127.0.0.1:5001"}
