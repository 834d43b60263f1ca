"""The launch compiler: a spec that would fail at CreateTrainingJob, CreateFileSystem or CreateSecurityGroup fails
at `lustrain validate` instead, naming the field; every spec it accepts makes requests AWS's rules accept."""

from __future__ import annotations

from pathlib import Path

import pytest
import regex
from botocore.validate import ParamValidator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lustrain_core import aws_requests, launch_plan, limits
from lustrain_core.config import Settings
from lustrain_core.document import Code, Filesystem, Network, Run, Sections
from lustrain_core.errors import SpecInvalid
from lustrain_core.launch import PLACEHOLDER_GROUP, PLACEHOLDER_SUBNET, compile_offline, job_of
from lustrain_core.launch_plan import check_resumable
from lustrain_core.spec import validate_spec

BASE = {
    "name": "gpt",
    "code": {"source": "s3://code/gpt/"},
    "data": {"s3_uri": "s3://bkt/data/", "size_gib": 100},
    "output": {"s3_uri": "s3://bkt/out/"},
}


def spec_with(**sections):
    doc = {**BASE}
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    return validate_spec(doc)


def refused(spec) -> dict[str, str]:
    with pytest.raises(SpecInvalid) as info:
        compile_offline(spec)
    return {e.path: e.message for e in info.value.errors}


def test_a_framework_version_without_a_sagemaker_image_is_refused_at_validate():
    assert "image.framework_version" in refused(spec_with(image={"framework_version": "1.2"}))


def test_a_name_that_makes_a_security_group_called_sg_is_refused_naming_name():
    errors = refused(spec_with(name="sg-team"))
    assert "not starting with sg-" in errors["name"]


def test_environment_names_and_sizes_createtrainingjob_refuses_are_named():
    errors = refused(spec_with(code={"environment": {"1BAD": "x", "GOOD": "y" * 513}}))
    assert set(errors) == {"code.environment.1BAD", "code.environment.GOOD"}
    assert "lustrain's own" in refused(spec_with(code={"environment": {"LUSTRAIN_RUN_ID": "z"}}))["code.environment.LUSTRAIN_RUN_ID"]


def test_a_hyperparameter_longer_than_sagemaker_takes_is_named():
    errors = refused(spec_with(code={"hyperparameters": {"prompt": "x" * 2600}}))
    assert "at most 2500" in errors["code.hyperparameters.prompt"]


def test_too_many_hyperparameters_say_how_many_are_left_for_the_spec():
    errors = refused(spec_with(code={"hyperparameters": {f"h{i}": i for i in range(97)}}))
    assert "at most 96" in errors["code.hyperparameters"]


@pytest.mark.parametrize("value", ["a#b", "50%", "x!"])
def test_a_tag_value_with_a_character_fsx_and_sagemaker_refuse_is_named(value):
    errors = refused(spec_with(tags={"team": value}))
    assert "tags.team" in errors and "tag value" in errors["tags.team"]


def test_each_run_checkpoints_under_its_own_job_id():
    spec = spec_with()
    _, first = compile_offline(spec)
    other = job_of(spec, "gpt-0badc0de")
    assert first.checkpoint_s3_uri == "s3://bkt/out/gpt-00000000/checkpoints/"
    assert other.launch.checkpoint_s3_uri == "s3://bkt/out/gpt-0badc0de/checkpoints/"


def manifest(preset="tiny", **overrides):
    config = {"n_layer": 2, "n_head": 4, "n_embd": 64, "seq_len": 64, "vocab_size": 257, "dropout": 0.0}
    config.update(overrides)
    return {"run": "gpt-0badc0de", "step": 150, "model_config": config,
            "shape": {"preset": preset, "default_preset": "tiny", "overrides": overrides}}


def test_a_checkpoint_of_a_renamed_preset_continues_under_its_name_now():
    """A checkpoint whose manifest says preset 70b (renamed gpt-64b) resumes with gpt-64b, and 70b is refused."""
    check_resumable(spec_with(code={"hyperparameters": {"preset": "gpt-64b"}}), manifest("70b"), "m")
    with pytest.raises(SpecInvalid, match=r"preset gpt-64b \(this spec's: 70b\)"):
        check_resumable(spec_with(code={"hyperparameters": {"preset": "70b"}}), manifest("70b"), "m")


def test_a_llama_checkpoint_saved_without_rope_scaling_continues_only_with_the_factor_0():
    """Saved before the llama3.1 presets had Llama 3's rope scaling: refused before anything bills, naming the fix."""
    old = manifest("llama3.1-8b")
    old["model_config"]["arch"] = "llama"  # the preset's own block: no override
    with pytest.raises(SpecInvalid, match=r"rope_scaling_factor 0 \(this spec's: 8: set code\.hyperparameters"):
        check_resumable(spec_with(code={"hyperparameters": {"preset": "llama3.1-8b"}}), old, "m")
    check_resumable(spec_with(code={"hyperparameters": {"preset": "llama3.1-8b", "rope_scaling_factor": "0"}}),
                    old, "m")
    new = manifest("llama3.1-8b")
    new["model_config"].update(arch="llama", rope_scaling={"rope_type": "llama3", "factor": 8.0})
    check_resumable(spec_with(code={"hyperparameters": {"preset": "llama3.1-8b"}}), new, "m")


def test_a_checkpoint_of_the_same_model_may_be_continued():
    check_resumable(spec_with(code={"hyperparameters": {"preset": "tiny", "max_steps": 300}}), manifest(), "m")
    check_resumable(spec_with(code={"hyperparameters": {"n_layer": "4"}}), manifest(n_layer=4), "m")


@pytest.mark.parametrize(
    ("hyperparameters", "earlier", "named"),
    [
        ({"preset": "85m"}, manifest(), "preset tiny"),
        ({}, manifest(n_layer=4), "n_layer 4"),
        ({"n_embd": 128}, manifest(), "n_embd 64"),
    ],
)
def test_a_checkpoint_of_another_model_is_refused_at_resume_from(hyperparameters, earlier, named):
    spec = spec_with(code={"hyperparameters": hyperparameters}, checkpoints={"resume_from": "gpt-0badc0de"})
    with pytest.raises(SpecInvalid) as info:
        check_resumable(spec, earlier, "s3://bkt/out/gpt-0badc0de/checkpoints/step-000000150.json")
    (error,) = info.value.errors
    assert error.path == "checkpoints.resume_from" and named in error.message


# --- the property: whatever validate accepts, AWS's rules accept ------------------------------------------

TAG_CHARS = regex.compile(r"^[\p{L}\p{Z}\p{N}_.:/=+\-@]*$")
TRAINING_JOB_NAME = regex.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
names = st.from_regex(r"\A[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?\Z")
text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=names,
    tags=st.dictionaries(st.text(min_size=1, max_size=20).filter(lambda k: not k.lower().startswith(("aws:", "lustrain:"))), text, max_size=4),
    hps=st.dictionaries(st.from_regex(r"\A[A-Za-z_][\w-]{0,20}\Z").filter(lambda k: not k.startswith("sagemaker_")), st.one_of(text, st.integers(), st.booleans()), max_size=4),
    env=st.dictionaries(st.text(max_size=12), text, max_size=3),
)
def test_any_spec_the_compiler_accepts_makes_requests_aws_accepts(name, tags, hps, env):
    try:
        spec = spec_with(name=name, tags=tags, code={"hyperparameters": hps, "environment": env})
        _, launch = compile_offline(spec)
    except SpecInvalid:
        return
    settings_ = Settings()
    job = job_of(spec, launch.job_id, settings_)
    net = Network(subnet_id=PLACEHOLDER_SUBNET, security_group_ids=[PLACEHOLDER_GROUP])
    run = Run(job, Sections(
        network=net,
        filesystem=Filesystem(file_system_id="fs-0123456789abcdef0", mount_name="abcdefgh"),
        code=Code(submit_directory="s3://artifacts/code/x/sourcedir.tar.gz"),
    ))
    name_1 = launch_plan.training_job_name(spec.name, launch.job_id, 1)
    requests = {
        ("sagemaker", "CreateTrainingJob"): aws_requests.training_job(run, name_1, settings_),
        ("fsx", "CreateFileSystem"): aws_requests.file_system(job, net, settings_),
        ("ec2", "CreateSecurityGroup"): aws_requests.security_group(job, "vpc-0123456789abcdef0"),
    }
    for (service, operation), request in requests.items():
        report = ParamValidator().validate(request, limits.input_shape(service, operation))
        assert not report.has_errors(), report.generate_report()
    training_request = requests[("sagemaker", "CreateTrainingJob")]
    assert TRAINING_JOB_NAME.match(training_request["TrainingJobName"])
    for tag in training_request["Tags"] + requests[("fsx", "CreateFileSystem")]["Tags"]:
        assert TAG_CHARS.match(tag["Key"]) and TAG_CHARS.match(tag["Value"]) and len(tag["Value"]) <= 256
    for key, value in training_request["Environment"].items():
        assert regex.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", key) and len(key) <= 512 and len(value) <= 512
    for key, value in training_request["HyperParameters"].items():
        assert len(key) <= 256 and len(value) <= 2500 and "\n" not in value
    group = requests[("ec2", "CreateSecurityGroup")]["GroupName"]
    assert not group.startswith("sg-") and len(group) <= 255


def test_the_trainer_and_the_control_plane_name_the_run_variables_and_the_channel_alike():
    """lustrain_trainer ships alone to SageMaker and cannot import the core: the contract is held here."""
    from lustrain_core import launch_plan as launch
    from lustrain_trainer import checkpoint, trainer

    assert (launch.RUN_ID_VARIABLE, launch.RESUME_FROM_VARIABLE) == (checkpoint.RUN_ID_ENV, checkpoint.RESUME_FROM_ENV)
    assert f"SM_CHANNEL_{launch.RESUME_CHANNEL.upper()}" == trainer.RESUME_CHANNEL_ENV
    assert launch.MANIFEST_NAME.fullmatch(checkpoint.manifest_path(Path("."), 6).name)


@pytest.mark.parametrize(
    ("owner", "run", "resume_from", "refused"),
    [
        ("a-00000001", "a-00000001", None, False),  # its own (a SageMaker retry of the same run)
        ("a-00000001", "b-00000002", "a-00000001", False),  # the run it was told to continue
        ("a-00000001", "b-00000002", None, True),  # another run's, not named
        (None, "b-00000002", None, True),  # written without a run id
        ("a-00000001", None, None, False),  # outside lustrain (no run id): the trainer's own choice
    ],
)
def test_the_trainer_continues_only_its_own_or_the_named_runs_checkpoint(owner, run, resume_from, refused):
    from lustrain_trainer import checkpoint

    assert bool(checkpoint.foreign({"run": owner}, run, resume_from)) is refused
