"""The twin reads the instance catalogue: quotas for every catalogued type, local NVMe (no VolumeKmsKeyId) and EFA
(the security group's self rules) from the type's row, so a type added there is one the twin knows."""

from __future__ import annotations

import pytest
from lustrain_core.instance_types import INSTANCE_TYPES
from moto.sagemaker.exceptions import ValidationError
from twinhelpers import client

from lustrain.twin.patches.sagemaker import _check_volume_key, has_local_nvme
from lustrain.twin.simulator.network import uses_efa

KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


@pytest.mark.usefixtures("moto_twin")
def test_every_catalogued_type_has_its_rows_training_quotas_default_zero_for_the_giant_ones() -> None:
    pages = (
        client("service-quotas")
        .get_paginator("list_aws_default_service_quotas")
        .paginate(ServiceCode="sagemaker")
    )
    quotas = {q["QuotaName"]: q["Value"] for page in pages for q in page["Quotas"]}
    for row in INSTANCE_TYPES.values():
        assert row.quota_names.training in quotas, row.name
        assert row.quota_names.spot in quotas, row.name
    for name in ("ml.p5e.48xlarge", "ml.p5en.48xlarge", "ml.p6-b200.48xlarge"):
        assert quotas[f"{name} for training job usage"] == 0.0


@pytest.mark.parametrize("name", sorted(INSTANCE_TYPES))
def test_local_nvme_and_efa_follow_the_catalogue(name: str) -> None:
    row = INSTANCE_TYPES[name]
    assert has_local_nvme(name) is row.local_nvme
    assert uses_efa(name) is row.efa


def test_a_volume_key_on_p5en_is_refused_as_aws_refuses_it_on_local_storage() -> None:
    with pytest.raises(ValidationError, match="You can't request a VolumeKmsKeyId"):
        _check_volume_key({"InstanceType": "ml.p5en.48xlarge", "InstanceCount": 1, "VolumeKmsKeyId": KEY})
    _check_volume_key({"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeKmsKeyId": KEY})
