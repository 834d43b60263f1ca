"""The CreateTrainingJob request start_training sends, checked against SageMaker's own API model (botocore)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import botocore.session
import pytest
from botocore.validate import validate_parameters
from lustrain_core.config import Settings
from lustrain_core.errors import SpecInvalid
from lustrain_core.launch import registered
from lustrain_core.spec import validate_spec
from lustrain_core.steps.training import build_training_request, training_job_name

EVENTS = Path(__file__).resolve().parents[2] / "events"
SETTINGS = Settings(
    region="us-east-1",
    artifacts_bucket="lustrain-artifacts-123456789012",
    sagemaker_role_arn="arn:aws:iam::123456789012:role/lustrain-sagemaker",
    stack_name="lustrain-prod",
)
OPERATION = botocore.session.get_session().get_service_model("sagemaker").operation_model("CreateTrainingJob")


def document(spec_changes: dict | None = None, **sections) -> dict:
    """The sample start_training input (events/start_training.json), with spec sections and state keys changed."""
    doc = json.loads((EVENTS / "start_training.json").read_text())
    for section, values in (spec_changes or {}).items():
        spec = doc["job"]["spec"]
        spec[section] = {**spec[section], **values} if isinstance(values, dict) else values
    for key, value in sections.items():
        doc[key] = {**doc[key], **value}
    # the launch plan of the changed spec, compiled as register_job compiles it (SpecInvalid as it refuses it)
    # (on the sample's own plan: the planner's rules are tested apart)
    spec = validate_spec(doc["job"]["spec"])
    doc["job"].update(registered(spec, doc["job"]["job_id"], SETTINGS, plan=doc["job"]["plan"]))
    return doc


def request_for(doc: dict, settings: Settings = SETTINGS, attempt: int = 1) -> dict:
    name = training_job_name(doc["job"]["spec"]["name"], doc["job"]["job_id"], attempt)
    return build_training_request(doc, training_job_name=name, settings=settings)


def _python_regex(pattern: str) -> bool:
    """The model's patterns are Java regexes; the few with \\p{...} classes (tags) are left to AWS."""
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


def _constraint_problems(value, shape, path="") -> list[str]:
    """What botocore's validator leaves out: maximum lengths and sizes, patterns and enums of the API model."""
    problems = []
    meta = shape.metadata
    if shape.type_name == "structure":
        for key, member in value.items():
            problems += _constraint_problems(member, shape.members[key], f"{path}.{key}")
    elif shape.type_name == "list":
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{path}: {len(value)} items > {meta['max']}")
        for i, item in enumerate(value):
            problems += _constraint_problems(item, shape.member, f"{path}[{i}]")
    elif shape.type_name == "map":
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{path}: {len(value)} entries > {meta['max']}")
        for key, item in value.items():
            problems += _constraint_problems(key, shape.key, f"{path} key {key}")
            problems += _constraint_problems(item, shape.value, f"{path}.{key}")
    elif shape.type_name == "string":
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{path}: {len(value)} chars > {meta['max']}")
        if "pattern" in meta and _python_regex(meta["pattern"]) and not re.fullmatch(meta["pattern"], value):
            problems.append(f"{path}: {value!r} does not match {meta['pattern']}")
        if "enum" in meta and value not in meta["enum"]:
            problems.append(f"{path}: {value!r} not one of the API's values")
    elif shape.type_name in ("integer", "long") and "max" in meta and value > meta["max"]:
        problems.append(f"{path}: {value} > {meta['max']}")
    return problems


def assert_valid_for_sagemaker(request: dict) -> None:
    validate_parameters(request, OPERATION.input_shape)
    assert _constraint_problems(request, OPERATION.input_shape) == []


# --- the name ----------------------------------------------------------------------------------------


def test_the_name_is_spec_name_job_hex_and_attempt():
    assert training_job_name("gpt-small", "gpt-small-5ed4fdf7", 3) == "gpt-small-5ed4fdf7-3"


def test_a_40_char_spec_name_still_makes_a_valid_63_char_name():
    spec_name = "a" * 19 + "-" + "b" * 20
    assert len(spec_name) == 40
    name = training_job_name(spec_name, f"{spec_name}-0123abcd", 9_999_999)
    assert len(name) <= 63
    assert re.fullmatch(OPERATION.input_shape.members["TrainingJobName"].metadata["pattern"], name)


def test_an_attempt_that_would_overflow_63_chars_is_refused_rather_than_sent():
    spec_name = "a" * 40
    with pytest.raises(ValueError, match="at most 63"):
        training_job_name(spec_name, f"{spec_name}-0123abcd", 10**13)


def test_a_job_id_not_of_register_jobs_form_is_refused():
    with pytest.raises(SpecInvalid) as info:
        training_job_name("gpt", "other-0123abcd", 1)
    assert info.value.errors[0].path == "job.job_id"


# --- the whole request -------------------------------------------------------------------------------


def test_the_sample_request_is_valid_for_the_sagemaker_api():
    assert_valid_for_sagemaker(request_for(document()))


def test_script_mode_hyperparameters_are_json_strings():
    hp = request_for(document())["HyperParameters"]
    assert hp["sagemaker_program"] == '"train.py"'
    assert hp["sagemaker_submit_directory"] == json.dumps(document()["code"]["submit_directory"])
    assert hp["sagemaker_region"] == '"us-east-1"'
    assert hp["sagemaker_torch_distributed_enabled"] == "true"
    assert hp["preset"] == '"gpt-350m"'
    assert all(isinstance(v, str) for v in hp.values())


def test_spec_hyperparameters_of_every_type_are_encoded_as_the_sdk_does():
    doc = document({"code": {"hyperparameters": {"lr": 0.0003, "steps": 100, "compile": False, "name": "x"}}})
    hp = request_for(doc)["HyperParameters"]
    assert (hp["lr"], hp["steps"], hp["compile"], hp["name"]) == ("0.0003", "100", "false", '"x"')


def test_without_torchrun_the_distributed_flag_is_absent():
    hp = request_for(document({"code": {"distribution": "none"}}))["HyperParameters"]
    assert "sagemaker_torch_distributed_enabled" not in hp


def test_lustre_is_the_training_channel_read_only():
    (channel,) = request_for(document())["InputDataConfig"]
    assert channel["ChannelName"] == "training"
    assert channel["DataSource"]["FileSystemDataSource"] == {
        "FileSystemId": "fs-0123456789abcdef0",
        "FileSystemType": "FSxLustre",
        "FileSystemAccessMode": "ro",
        "DirectoryPath": "/abcdef12/data",
    }


def test_output_to_the_file_system_mounts_read_write_with_an_output_channel():
    doc = document({"output": {"to_filesystem": True}})
    request = request_for(doc)
    training, output = request["InputDataConfig"]
    assert training["DataSource"]["FileSystemDataSource"]["FileSystemAccessMode"] == "rw"
    assert output["ChannelName"] == "output"
    source = output["DataSource"]["FileSystemDataSource"]
    assert source["FileSystemAccessMode"] == "rw"
    assert source["DirectoryPath"] == f"/abcdef12/lustrain-output/{doc['job']['job_id']}"
    assert "VolumeSizeInGB" not in request["ResourceConfig"]
    assert_valid_for_sagemaker(request)


def test_the_image_is_the_regions_pytorch_dlc_for_the_version():
    image = request_for(document())["AlgorithmSpecification"]["TrainingImage"]
    assert image == "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8-gpu-py312"


def test_a_custom_image_is_used_as_given():
    uri = "111122223333.dkr.ecr.us-east-1.amazonaws.com/my-trainer:v7"
    doc = document({"image": {"framework_version": None, "uri": uri}})
    assert request_for(doc)["AlgorithmSpecification"]["TrainingImage"] == uri


def test_an_unknown_framework_version_names_the_field_and_the_versions():
    with pytest.raises(SpecInvalid) as info:
        request_for(document({"image": {"framework_version": "1.2"}}))
    assert info.value.errors[0].path == "image.framework_version"
    assert "2.8" in info.value.errors[0].message


def test_metric_definitions_come_from_the_code_step():
    algorithm = request_for(document())["AlgorithmSpecification"]
    assert algorithm["MetricDefinitions"] == document()["code"]["metric_definitions"]
    assert algorithm["TrainingInputMode"] == "File"
    assert (
        "MetricDefinitions"
        not in request_for(document(code={"metric_definitions": []}))["AlgorithmSpecification"]
    )


def test_network_output_checkpoints_role_and_tags():
    doc = document()
    request = request_for(doc)
    assert request["VpcConfig"] == {
        "Subnets": ["subnet-0f1e2d3c4b5a69788"],
        "SecurityGroupIds": ["sg-0123456789abcdef0"],
    }
    # under the run's own archive: SageMaker uploads the model where it is archived, nothing is copied
    assert request["OutputDataConfig"] == {
        "S3OutputPath": f"s3://{SETTINGS.artifacts_bucket}/archive/{doc['job']['job_id']}/jobs/",
        # the sample's output.expected_size_gib is 50: its model goes up as its files
        "CompressionType": "NONE",
    }
    # the job's session of its role carries the launcher session's tags (lustrain-run)
    assert request["SessionChainingConfig"] == {"EnableSessionTagChaining": True}
    assert request["CheckpointConfig"] == {
        "S3Uri": f"s3://my-team-results/default/{doc['job']['job_id']}/checkpoints/",
        "LocalPath": "/opt/ml/checkpoints",
    }
    assert request["RoleArn"] == SETTINGS.sagemaker_role_arn
    tags = {t["Key"]: t["Value"] for t in request["Tags"]}
    assert tags == {
        "team": "llm",
        "lustrain:team": "default",
        "Name": f"{doc['job']['job_id']}-training",
        "lustrain:job-id": doc["job"]["job_id"],
        "lustrain:created-by": "lustrain-prod",
    }
    assert request["EnableInterContainerTrafficEncryption"] is False
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 24 * 3600}
    assert request["EnableManagedSpotTraining"] is False and "RetryStrategy" not in request


def test_p4d_gets_no_volume_size_and_never_a_volume_key():
    settings = Settings(**{**SETTINGS.__dict__, "extra": {"LUSTRAIN_KMS_KEY_ID": "alias/lustrain"}})
    request = request_for(document(), settings)
    assert request["ResourceConfig"] == {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2}
    assert request["OutputDataConfig"]["KmsKeyId"] == "alias/lustrain"


def test_an_ebs_only_type_gets_a_volume_sized_for_its_output_and_the_key():
    settings = Settings(**{**SETTINGS.__dict__, "extra": {"LUSTRAIN_KMS_KEY_ID": "alias/lustrain"}})
    doc = document(
        {
            "compute": {"instance_type": "ml.m5.xlarge", "instance_count": 1},
            "output": {"expected_size_gib": 50},
        }
    )
    request = request_for(doc, settings)
    assert request["ResourceConfig"] == {
        "InstanceType": "ml.m5.xlarge",
        "InstanceCount": 1,
        "VolumeSizeInGB": 100,
        "VolumeKmsKeyId": "alias/lustrain",
    }
    assert_valid_for_sagemaker(request)
    small = request_for(
        document({"compute": {"instance_type": "ml.m5.xlarge"}, "output": {"expected_size_gib": 1}})
    )
    assert small["ResourceConfig"]["VolumeSizeInGB"] == 30


def test_spot_waits_retries_and_checkpoints():
    doc = document({"compute": {"spot": True, "max_runtime_hours": 10, "max_wait_hours": 30}})
    request = request_for(doc)
    assert request["EnableManagedSpotTraining"] is True
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 36000, "MaxWaitTimeInSeconds": 108000}
    assert request["RetryStrategy"] == {"MaximumRetryAttempts": 2}
    assert request["CheckpointConfig"]["S3Uri"].startswith("s3://")
    assert_valid_for_sagemaker(request)


def test_spot_without_max_wait_may_wait_a_day_for_capacity_beyond_its_runtime():
    # MaxWait counts the wait and the run: equal to MaxRuntime, it would leave no time to wait for a spot instance
    request = request_for(document({"compute": {"spot": True, "max_runtime_hours": 2}}))
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 7200, "MaxWaitTimeInSeconds": (2 + 24) * 3600}
    longest = request_for(document({"compute": {"spot": True, "max_runtime_hours": 28 * 24}}))
    assert longest["StoppingCondition"]["MaxWaitTimeInSeconds"] == 28 * 24 * 3600


def test_environment_passes_through_and_is_checked_against_the_api():
    doc = document({"code": {"environment": {"NCCL_DEBUG": "INFO"}}})
    # the trainer learns its run from LUSTRAIN_RUN_ID: it continues only that run's checkpoints; torchrun gives its
    # workers 110 of SageMaker's 120 s to save on a stop, unless the spec says otherwise
    environment = request_for(doc)["Environment"]
    stops = {k: environment.pop(k) for k in list(environment) if k.startswith("LUSTRAIN_STOP_")
             or k == "LUSTRAIN_MAX_RUNTIME_SECONDS"}
    # the trainer's S3 client reads the stop request in the run's region (no region: s3.amazonaws.com, unreachable
    # from the run's subnet)
    assert environment.pop("AWS_DEFAULT_REGION") == "us-east-1"
    assert environment == {"NCCL_DEBUG": "INFO", "LUSTRAIN_RUN_ID": doc["job"]["job_id"],
                           "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "110",
                           "LUSTRAIN_TENSORBOARD_DIR": "/opt/ml/output/tensorboard"}
    # how the stack asks the trainer to stop (no signal reaches it), and its deadline: MaxRuntimeInSeconds
    assert stops["LUSTRAIN_STOP_REQUEST"].endswith(f"/control/{doc['job']['job_id']}/stop-request.json")
    assert stops["LUSTRAIN_MAX_RUNTIME_SECONDS"] == str(request_for(doc)["StoppingCondition"]["MaxRuntimeInSeconds"])
    assert set(stops) == {"LUSTRAIN_STOP_REQUEST", "LUSTRAIN_STOP_POLL_SECONDS", "LUSTRAIN_MAX_RUNTIME_SECONDS",
                          "LUSTRAIN_STOP_RESERVE_SECONDS", "LUSTRAIN_STOP_WAIT_SECONDS"}
    mine = document({"code": {"environment": {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "60"}}})
    assert request_for(mine)["Environment"]["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "60"
    with pytest.raises(SpecInvalid) as info:
        request_for(document({"code": {"environment": {"1BAD": "x", "GOOD": "y" * 513}}}))
    assert {e.path for e in info.value.errors} == {"code.environment.1BAD", "code.environment.GOOD"}


def test_a_hyperparameter_longer_than_sagemaker_takes_is_named():
    with pytest.raises(SpecInvalid) as info:
        request_for(document({"code": {"hyperparameters": {"prompt": "x" * 2600}}}))
    assert info.value.errors[0].path == "code.hyperparameters.prompt"


def test_too_many_hyperparameters_say_how_many_are_left_for_the_spec():
    many = {f"h{i}": i for i in range(97)}
    with pytest.raises(SpecInvalid) as info:
        request_for(document({"code": {"hyperparameters": many}}))
    assert "at most 96" in info.value.errors[0].message


def test_a_document_without_the_network_is_refused_by_name():
    doc = copy.deepcopy(document())
    del doc["network"]
    with pytest.raises(SpecInvalid) as info:
        request_for(doc)
    assert "lacks $.network (made by create_network)" in str(info.value)


def test_output_compression_gzip_is_one_model_tar_gz_whatever_the_size():
    request = request_for(document({"output": {"compression": "gzip"}}))
    assert request["OutputDataConfig"]["CompressionType"] == "GZIP"


def test_a_run_registered_before_the_archive_path_still_writes_to_its_results_location():
    doc = document()
    doc["job"]["launch"].pop("model_output_s3_uri")
    doc["job"]["launch"].pop("output_compression")
    request = request_for(doc)
    assert request["OutputDataConfig"] == {
        "S3OutputPath": f"s3://my-team-results/default/{doc['job']['job_id']}/",
        "CompressionType": "GZIP",
    }


def test_a_run_registered_before_the_launch_plan_held_its_instances_sends_the_same_request():
    """A run recorded by the release before (its launch plan without `instances`, its model's location null, its
    warm-up without an output) still running at a deploy: the missing decisions are made by the launch plan's own
    functions, and its next attempt's request is what the run registered now would send (less the model's
    location, which was then the results location)."""
    now = document({"compute": {"instance_type": "ml.m5.xlarge", "instance_count": 2}})
    before = copy.deepcopy(now)
    del before["job"]["launch"]["instances"]
    before["job"]["launch"]["model_output_s3_uri"] = None
    sent_now = build_training_request(now, training_job_name="gpt-small-5ed4fdf7-1", settings=SETTINGS)
    sent_before = build_training_request(before, training_job_name="gpt-small-5ed4fdf7-1", settings=SETTINGS)
    assert sent_before["ResourceConfig"] == sent_now["ResourceConfig"]
    assert sent_before["ResourceConfig"]["VolumeSizeInGB"] >= 30  # no local NVMe on m5: a volume
    assert sent_before["OutputDataConfig"]["S3OutputPath"] == f"{now['job']['spec']['output']['s3_uri'].rstrip('/')}/{now['job']['job_id']}/"
    # its TensorBoard files go beside its model, where its role writes
    assert sent_before["TensorBoardOutputConfig"]["S3OutputPath"] == sent_before["OutputDataConfig"]["S3OutputPath"]
    sent_before["OutputDataConfig"] = sent_now["OutputDataConfig"]
    sent_before["TensorBoardOutputConfig"] = sent_now["TensorBoardOutputConfig"]
    assert sent_before == sent_now


def test_a_warm_up_recorded_before_it_held_its_output_location_still_gets_one():
    from lustrain_core import aws_requests
    from lustrain_core.document import Run

    now = document({"data": {"preload": True}})
    before = copy.deepcopy(now)
    del before["job"]["launch"]["preload"]["output_s3_uri"]
    sent_now = aws_requests.preload_job(Run.parse(now, "network", "filesystem"), SETTINGS)
    sent_before = aws_requests.preload_job(Run.parse(before, "network", "filesystem"), SETTINGS)
    assert sent_before == sent_now
    assert sent_now["OutputDataConfig"]["S3OutputPath"].endswith(f"/{now['job']['job_id']}/warmup/")


def test_the_job_uploads_its_tensorboard_files_beside_its_model_where_the_trainer_writes_them():
    from lustrain_trainer.metrics import TENSORBOARD_DIR_ENV

    doc = document({})
    request = request_for(doc)
    config = request["TensorBoardOutputConfig"]
    # the run's own jobs/ prefix, which the job's role may write (and nothing else of the archive)
    assert config["S3OutputPath"] == request["OutputDataConfig"]["S3OutputPath"]
    assert config["S3OutputPath"].endswith(f"/archive/{doc['job']['job_id']}/jobs/")
    # the trainer writes where SageMaker uploads from (a spec may not set LUSTRAIN_* variables itself)
    assert request["Environment"][TENSORBOARD_DIR_ENV] == config["LocalPath"] == "/opt/ml/output/tensorboard"
    # botocore's model of CreateTrainingJob takes it
    model = botocore.session.get_session().get_service_model("sagemaker")
    shape = model.operation_model("CreateTrainingJob").input_shape.members["TensorBoardOutputConfig"]
    assert set(config) <= set(shape.members) and set(shape.required_members) <= set(config)
