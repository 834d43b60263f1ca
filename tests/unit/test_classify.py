"""A failed training job's FailureReason -> the error the state machine catches (its class name)."""

from __future__ import annotations

import pytest
from lustrain_core.errors import ALL_ERRORS
from lustrain_core.steps.events import classify_failure

# SageMaker's wordings (from its documentation and failed jobs' FailureReason)
TABLE = [
    (
        "CapacityError: Unable to provision requested ML compute capacity. Please retry using a different ML "
        "instance type or after some time.",
        "CapacityError",
    ),
    (
        "InsufficientCapacityError: We currently do not have sufficient ml.p4d.24xlarge capacity",
        "CapacityError",
    ),
    (
        "ResourceLimitExceeded: The account-level service limit 'ml.p4d.24xlarge for training job usage' is 4 "
        "Instances, with current utilization of 4 Instances and a request delta of 2 Instances.",
        "QuotaExceeded",
    ),
    (
        "ClientError: Unable to mount file system: fs-0123456789abcdef0. Please ensure that the file system "
        "exists, the subnets/security groups are configured properly.",
        "MountFailed",
    ),
    ("ClientError: Failed to mount FSx for Lustre file system fs-0123456789abcdef0", "MountFailed"),
    (
        "mount.lustre: mount 172.31.0.5@tcp:/abcdef12 at /opt/ml/input/data/training failed: Input/output error",
        "MountFailed",
    ),
    (
        'AlgorithmError: ExecuteUserScriptError: ExitCode 1 ErrorMessage "RuntimeError: CUDA out of memory"',
        "TrainingFailed",
    ),
    ("InternalServerError: We encountered an internal error. Please try again.", "InfrastructureError"),
    # the trainer's own report of a fault under it (trainer/lustrain_trainer/faults.py), and torchrun's summary
    (
        'AlgorithmError: ExecuteUserScriptError:\nExitCode 75\nErrorMessage "lustrain: infrastructure fault (nccl): '
        'DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"',
        "InfrastructureError",
    ),
    ('AlgorithmError: ExecuteUserScriptError:\nExitCode 1\nErrorMessage "  exitcode  : 75 (pid: 4121)"', "InfrastructureError"),
    (
        'AlgorithmError: ExitCode 1 ErrorMessage "RuntimeError: CUDA error: uncorrectable ECC error encountered"',
        "InfrastructureError",
    ),
    ('AlgorithmError: ExitCode 1 ErrorMessage "torch.OutOfMemoryError: CUDA out of memory. NCCL"', "TrainingFailed"),
    ("", "TrainingFailed"),
    (None, "TrainingFailed"),
]


@pytest.mark.parametrize(("reason", "error"), TABLE)
def test_failure_reasons_map_to_the_errors_the_state_machine_catches(reason, error):
    assert classify_failure(reason) == error


def test_every_class_it_names_is_one_the_state_machine_knows():
    assert {error for _, error in TABLE} <= set(ALL_ERRORS)


def test_a_script_error_that_mentions_capacity_words_in_passing_is_still_the_scripts_failure():
    reason = 'AlgorithmError: ExitCode 1 ErrorMessage "ValueError: tensor capacity must be positive"'
    assert classify_failure(reason) == "TrainingFailed"
