"""The spec refuses what it cannot honour: reserved tag keys in any case, keys given twice, credentials in the
environment, and no message repeats an environment value (issue 25, items 5 to 7)."""

from __future__ import annotations

import json

import pytest
from lustrain_core.errors import SpecInvalid
from lustrain_core.spec import load_spec

MINIMAL = "name: gpt\ndata: {s3_uri: s3://bkt/data/}\noutput: {s3_uri: s3://bkt/out/}\n"
SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:gpt/hf-token-AbCdEf"
PARAMETER_ARN = "arn:aws:ssm:us-east-1:123456789012:parameter/gpt/wandb"


def refused(text: str) -> SpecInvalid:
    with pytest.raises(SpecInvalid) as info:
        load_spec(text)
    return info.value


# --------------------------------------------------------------------------- 5: reserved tag keys, any case


@pytest.mark.parametrize(
    "key", ["Lustrain:created-by", "LUSTRAIN:job-id", "lustrain:x", "AWS:x", "Aws:cloudformation"]
)
def test_reserved_tag_prefixes_are_refused_in_any_case(key):
    # IAM matches aws:ResourceTag/<key> in any case: Lustrain:created-by would pass the stack's own tag conditions
    error = refused(MINIMAL + f"tags: {{'{key}': x}}\n")
    assert [e.path for e in error.errors] == ["tags"]
    assert key in error.errors[0].message and "reserved" in error.errors[0].message


@pytest.mark.parametrize(
    "key", ["lu\u017ftrain:created-by", "lus\u200btrain:job-id", "\ufeffaws:x", "\uff4custrain:team"]
)
def test_reserved_tag_prefixes_are_refused_however_they_are_spelled(key):
    # a long s folds to s in any case; zero-width characters and full-width letters read as nothing and as ASCII
    error = refused(MINIMAL + "tags: {" + json.dumps(key) + ": x}\n")
    assert [e.path for e in error.errors] == ["tags"]
    assert "reserved" in error.errors[0].message


@pytest.mark.parametrize("key", ["SageMaker_program", "SAGEMAKER_REGION", "\u017fagemaker_submit_directory"])
def test_sagemakers_own_hyperparameters_are_refused_in_any_case(key):
    error = refused(MINIMAL + "code: {hyperparameters: {" + json.dumps(key) + ": x}}\n")
    assert [e.path for e in error.errors] == ["code.hyperparameters"]
    assert "sagemaker_*" in error.errors[0].message


def test_a_tag_that_only_contains_a_reserved_word_is_kept():
    assert load_spec(MINIMAL + "tags: {team-lustrain: x, my:aws: y}\n").tags == {
        "team-lustrain": "x",
        "my:aws": "y",
    }


# --------------------------------------------------------------------------- 6: duplicate keys


def test_a_second_output_block_is_refused_naming_its_path_and_line():
    text = MINIMAL + "output:\n  s3_uri: s3://elsewhere/stolen/\n"
    error = refused(text)
    assert [(e.path, e.message.split(":")[0]) for e in error.errors] == [("output", "line 4")]
    assert "more than once" in str(error)


def test_duplicates_are_found_at_any_depth_with_their_lines():
    text = MINIMAL + "code:\n  hyperparameters:\n    lr: 1\n    lr: 2\n  environment: {A: b, A: c}\n"
    error = refused(text)
    assert {e.path: e.message.split(":")[0] for e in error.errors} == {
        "code.hyperparameters.lr": "line 7",
        "code.environment.A": "line 8",
    }
    # the duplicate's values are environment values: never shown
    assert "'b'" not in str(error) and "'c'" not in str(error)


def test_duplicates_in_a_json_spec_are_refused_too():
    text = json.dumps({"name": "gpt", "data": {"s3_uri": "s3://bkt/data/"}})[:-1]
    text += ', "output": {"s3_uri": "s3://bkt/out/"},\n "output": {"s3_uri": "s3://elsewhere/x/"}}'
    error = refused(text)
    assert [(e.path, e.message.split(":")[0]) for e in error.errors] == [("output", "line 2")]


def test_anchors_and_merge_keys_are_not_duplicates():
    text = MINIMAL + "x-common: &hp {lr: 1}\n"
    assert "x-common" in str(refused(text))  # an unknown field, not a duplicate
    spec = load_spec(MINIMAL + "code:\n  hyperparameters:\n    <<: {lr: 1}\n    lr: 2\n")
    assert spec.code.hyperparameters == {"lr": 2}


# --------------------------------------------------------------------------- 7: credentials, secrets, no echo

TOKENS = {
    "HF_TOKEN": "hf_" + "a1B2" * 9,
    "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
    "DB_PASSWORD": "correct horse",
    "SETTING": "AKIAIOSFODNN7EXAMPLE",
    "GITHUB": "ghp_" + "x" * 36,
    "DATABASE_URL": "postgres://user:pa55word@db.internal:5432/x",
    "KEY_PEM": "-----BEGIN RSA PRIVATE KEY-----\nMIIE",
}


@pytest.mark.parametrize(("name", "value"), list(TOKENS.items()))
def test_an_environment_value_that_looks_like_a_credential_is_refused_naming_code_secrets(name, value):
    error = refused(MINIMAL + "code:\n  environment:\n    " + json.dumps({name: value})[1:-1] + "\n")
    assert [e.path for e in error.errors] == ["code.environment"]
    assert name in error.errors[0].message and "code.secrets" in error.errors[0].message
    assert value[:8] not in str(error) and value[:8] not in json.dumps(error.to_dict())


@pytest.mark.parametrize(
    ("name", "value"),
    [("TOKENIZERS_PARALLELISM", "false"), ("NCCL_DEBUG", "INFO"), ("HF_TOKEN", ""), ("MODEL", "gpt-2")],
)
def test_ordinary_settings_are_kept(name, value):
    assert load_spec(MINIMAL + f"code: {{environment: {{{name}: '{value}'}}}}\n").code.environment == {
        name: value
    }


@pytest.mark.parametrize(
    "bad",
    [
        "code: {environment: {A: 12345678901234567890}}",
        "code: {environment: {A: [s3cr3t-valu3]}}",
        "code: {environment: 'HF=s3cr3t-valu3'}",
        "code: {environment: {LUSTRAIN_X: s3cr3t-valu3}, entry_point: /x.py}",
    ],
)
def test_no_error_message_repeats_an_environment_value(bad):
    error = refused(MINIMAL + bad + "\n")
    shown = str(error) + json.dumps(error.to_dict())
    assert "s3cr3t" not in shown and "1234567890" not in shown
    assert any(e.path.startswith("code") for e in error.errors)


def test_secrets_map_names_to_secrets_manager_or_ssm_arns():
    spec = load_spec(
        MINIMAL + f"code: {{secrets: {{HF_TOKEN: '{SECRET_ARN}', WANDB_API_KEY: '{PARAMETER_ARN}'}}}}\n"
    )
    assert spec.code.secrets == {"HF_TOKEN": SECRET_ARN, "WANDB_API_KEY": PARAMETER_ARN}


@pytest.mark.parametrize(
    ("secrets", "path", "words"),
    [
        ({"HF_TOKEN": "hf_plain_value"}, "code.secrets.HF_TOKEN", "Secrets Manager"),
        ({"HF_TOKEN": "arn:aws:s3:::bucket/key"}, "code.secrets.HF_TOKEN", "SSM"),
        ({"1BAD": SECRET_ARN}, "code.secrets", "environment variable's name"),
        ({"LUSTRAIN_RUN_ID": SECRET_ARN}, "code.secrets", "LUSTRAIN_"),
        # each named secret is a session tag of the job's session, and the role's policy has 8 slots
        ({f"S{i}": SECRET_ARN for i in range(9)}, "code.secrets", "at most 8"),
        # its name is the value of a session tag, which STS takes up to 256 characters
        ({"LONG": SECRET_ARN.replace("hf-token", "t" * 250)}, "code.secrets", "at most 256 characters"),
    ],
)
def test_bad_secrets_name_the_field(secrets, path, words):
    error = refused(MINIMAL + "code: " + json.dumps({"secrets": secrets}) + "\n")
    messages = {e.path: e.message for e in error.errors}
    assert path in messages and words in messages[path], messages


def test_a_name_in_both_environment_and_secrets_is_refused():
    error = refused(
        MINIMAL + "code: " + json.dumps({"environment": {"A": "b"}, "secrets": {"A": SECRET_ARN}}) + "\n"
    )
    assert [e.path for e in error.errors] == ["code.secrets"] and "both" in error.errors[0].message
